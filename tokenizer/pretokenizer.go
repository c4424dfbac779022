package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// piece is a pre-token: text the model tokenizes on its own. atStart records that it begins at
// offset 0 of the input, which Metaspace's prepend_scheme "first" asks about.
type piece struct {
	text    string
	atStart bool
}

// A preTokenizer cuts pieces into smaller pieces (and may rewrite them, as ByteLevel does).
type preTokenizer interface {
	preTokenize(pieces []piece) []piece
}

// splitPieces applies a pattern and a behavior to every piece.
func splitPieces(pieces []piece, p pattern, b behavior, invert bool) []piece {
	var out []piece
	for _, pc := range pieces {
		spans := p.spans(pc.text)
		if invert {
			spans = invertSpans(spans)
		}
		for _, sp := range splitSpans(spans, b) {
			out = append(out, piece{pc.text[sp.start:sp.end], pc.atStart && sp.start == 0})
		}
	}
	return out
}

// gpt2Pattern is the regex of the ByteLevel pre-tokenizer (GPT-2's contractions, letters, numbers,
// other symbols, and white space that leaves its last space to the following word).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

var gpt2Regex = mustCompileRegex(gpt2Pattern)

func mustCompileRegex(expr string) *regexPattern {
	p, err := compileRegex(expr)
	if err != nil {
		panic(err)
	}
	return p
}

// byteLevel splits with the GPT-2 regex (optionally) and then rewrites every byte as its
// byte-level rune.
type byteLevel struct {
	addPrefixSpace bool
	useRegex       bool
}

func (b byteLevel) preTokenize(pieces []piece) []piece {
	if b.addPrefixSpace {
		withSpace := make([]piece, len(pieces))
		for i, pc := range pieces {
			if !strings.HasPrefix(pc.text, " ") {
				pc.text = " " + pc.text
			}
			withSpace[i] = pc
		}
		pieces = withSpace
	}
	if b.useRegex {
		pieces = splitPieces(pieces, gpt2Regex, isolated, false)
	}
	out := make([]piece, len(pieces))
	for i, pc := range pieces {
		out[i] = piece{byteLevelEncode(pc.text), pc.atStart}
	}
	return out
}

type split struct {
	pattern  pattern
	behavior behavior
	invert   bool
}

func (s split) preTokenize(pieces []piece) []piece {
	return splitPieces(pieces, s.pattern, s.behavior, s.invert)
}

// metaspace is SentencePiece's convention: spaces become "▁", a "▁" is prepended according to the
// prepend scheme, and (with split) every "▁" starts a new piece.
type metaspace struct {
	replacement   string
	prependScheme string // "always", "first" or "never"
	split         bool
}

func (m metaspace) preTokenize(pieces []piece) []piece {
	out := make([]piece, 0, len(pieces))
	for _, pc := range pieces {
		text := strings.ReplaceAll(pc.text, " ", m.replacement)
		prependHere := m.prependScheme == "always" || (m.prependScheme == "first" && pc.atStart)
		if prependHere && !strings.HasPrefix(text, m.replacement) {
			text = m.replacement + text
		}
		out = append(out, piece{text, pc.atStart})
	}
	if !m.split {
		return out
	}
	r, _ := utf8.DecodeRuneInString(m.replacement)
	return splitPieces(out, runePattern(func(c rune) bool { return c == r }), mergedWithNext, false)
}

// digits separates numbers from the rest, each digit on its own when individual is set.
type digits struct{ individual bool }

func (d digits) preTokenize(pieces []piece) []piece {
	b := contiguous
	if d.individual {
		b = isolated
	}
	return splitPieces(pieces, runePattern(unicode.IsNumber), b, false)
}

type preTokenizerSequence []preTokenizer

func (seq preTokenizerSequence) preTokenize(pieces []piece) []piece {
	for _, p := range seq {
		pieces = p.preTokenize(pieces)
	}
	return pieces
}

type preTokenizerJSON struct {
	Type             string            `json:"type"`
	Pretokenizers    []json.RawMessage `json:"pretokenizers"`
	AddPrefixSpace   *bool             `json:"add_prefix_space"`
	UseRegex         *bool             `json:"use_regex"`
	Pattern          json.RawMessage   `json:"pattern"`
	Behavior         string            `json:"behavior"`
	Invert           bool              `json:"invert"`
	Replacement      string            `json:"replacement"`
	PrependScheme    string            `json:"prepend_scheme"`
	Split            *bool             `json:"split"`
	IndividualDigits bool              `json:"individual_digits"`
}

// parsePreTokenizer builds a pre-tokenizer from tokenizer.json; null gives nil (the whole text is
// one piece).
func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c preTokenizerJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	switch c.Type {
	case "ByteLevel":
		return byteLevel{addPrefixSpace: orDefault(c.AddPrefixSpace, true), useRegex: orDefault(c.UseRegex, true)}, nil
	case "Split":
		p, err := parsePattern(c.Pattern)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("pre_tokenizer Split: %w", err)
		}
		return split{p, b, c.Invert}, nil
	case "Metaspace":
		return parseMetaspace(c)
	case "Digits":
		return digits{c.IndividualDigits}, nil
	case "Whitespace":
		return split{mustCompileRegex(`\w+|[^\w\s]+`), removed, true}, nil
	case "WhitespaceSplit":
		return split{runePattern(unicode.IsSpace), removed, false}, nil
	case "Sequence":
		var seq preTokenizerSequence
		for _, sub := range c.Pretokenizers {
			p, err := parsePreTokenizer(sub)
			if err != nil {
				return nil, err
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("unsupported pre_tokenizer type %q", c.Type)
}

func parseMetaspace(c preTokenizerJSON) (metaspace, error) {
	m := metaspace{replacement: c.Replacement, prependScheme: c.PrependScheme, split: orDefault(c.Split, true)}
	if utf8.RuneCountInString(m.replacement) != 1 {
		return m, fmt.Errorf("Metaspace: replacement %q is not a single character", m.replacement)
	}
	if m.prependScheme == "" { // files written before prepend_scheme existed
		m.prependScheme = "never"
		if orDefault(c.AddPrefixSpace, true) {
			m.prependScheme = "always"
		}
	}
	switch m.prependScheme {
	case "always", "first", "never":
		return m, nil
	}
	return m, fmt.Errorf("Metaspace: unknown prepend_scheme %q", m.prependScheme)
}

func orDefault(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}
