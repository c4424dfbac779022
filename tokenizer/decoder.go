package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A decoder turns the tokens of a sequence of ids back into text pieces; Decode joins them.
type decoder interface {
	decode(tokens []string) []string
}

// byteLevelDecoder maps byte-level runes back to bytes and reads them as UTF-8 (invalid sequences
// become U+FFFD, as Rust's from_utf8_lossy does).
type byteLevelDecoder struct{}

func (byteLevelDecoder) decode(tokens []string) []string {
	var bytes []byte
	for _, t := range tokens {
		bytes = byteLevelDecode(bytes, t)
	}
	return []string{lossyUTF8(bytes)}
}

// metaspaceDecoder turns "▁" back into spaces; the first token loses its "▁"s when a prefix was
// prepended at encode time.
type metaspaceDecoder struct {
	replacement rune
	dropFirst   bool
}

func (m metaspaceDecoder) decode(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		var b strings.Builder
		for _, r := range t {
			switch {
			case r != m.replacement:
				b.WriteRune(r)
			case i > 0 || !m.dropFirst:
				b.WriteByte(' ')
			}
		}
		out[i] = b.String()
	}
	return out
}

// byteFallbackDecoder joins runs of "<0xNN>" tokens into the text their bytes spell, or one U+FFFD
// per byte when they are not valid UTF-8.
type byteFallbackDecoder struct{}

func (byteFallbackDecoder) decode(tokens []string) []string {
	var out []string
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if b, ok := parseByteToken(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// parseByteToken reads a byte-fallback token "<0xNN>".
func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	v, err := strconv.ParseUint(t[3:5], 16, 8)
	return byte(v), err == nil
}

type fuseDecoder struct{}

func (fuseDecoder) decode(tokens []string) []string { return []string{strings.Join(tokens, "")} }

// stripDecoder removes up to start leading and stop trailing copies of a character from each token.
type stripDecoder struct {
	content     rune
	start, stop int
}

func (s stripDecoder) decode(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		runes := []rune(t)
		lo, hi := 0, len(runes)
		for lo < s.start && lo < hi && runes[lo] == s.content {
			lo++
		}
		for n := 0; n < s.stop && hi > lo && runes[hi-1] == s.content; n++ {
			hi--
		}
		out[i] = string(runes[lo:hi])
	}
	return out
}

type replaceDecoder struct{ replace }

func (r replaceDecoder) decode(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = r.normalize(t)
	}
	return out
}

type decoderSequence []decoder

func (seq decoderSequence) decode(tokens []string) []string {
	for _, d := range seq {
		tokens = d.decode(tokens)
	}
	return tokens
}

type decoderJSON struct {
	Type           string            `json:"type"`
	Decoders       []json.RawMessage `json:"decoders"`
	Replacement    string            `json:"replacement"`
	PrependScheme  string            `json:"prepend_scheme"`
	AddPrefixSpace *bool             `json:"add_prefix_space"`
	Pattern        json.RawMessage   `json:"pattern"`
	Content        string            `json:"content"`
	Start          int               `json:"start"`
	Stop           int               `json:"stop"`
}

// parseDecoder builds a decoder from tokenizer.json; null gives nil (tokens joined by spaces).
func parseDecoder(raw json.RawMessage) (decoder, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c decoderJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	switch c.Type {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "Metaspace":
		m, err := parseMetaspace(preTokenizerJSON{Replacement: c.Replacement, PrependScheme: c.PrependScheme, AddPrefixSpace: c.AddPrefixSpace})
		if err != nil {
			return nil, fmt.Errorf("decoder %w", err)
		}
		r, _ := utf8.DecodeRuneInString(m.replacement)
		return metaspaceDecoder{replacement: r, dropFirst: m.prependScheme != "never"}, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Strip":
		if utf8.RuneCountInString(c.Content) != 1 {
			return nil, fmt.Errorf("decoder Strip: content %q is not a single character", c.Content)
		}
		r, _ := utf8.DecodeRuneInString(c.Content)
		return stripDecoder{r, c.Start, c.Stop}, nil
	case "Replace":
		p, err := parsePattern(c.Pattern)
		if err != nil {
			return nil, fmt.Errorf("decoder Replace: %w", err)
		}
		return replaceDecoder{replace{p, c.Content}}, nil
	case "Sequence":
		var seq decoderSequence
		for _, sub := range c.Decoders {
			d, err := parseDecoder(sub)
			if err != nil {
				return nil, err
			}
			if d != nil {
				seq = append(seq, d)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("unsupported decoder type %q", c.Type)
}
