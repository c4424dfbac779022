package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// span is a byte range of a string and whether a pattern matched it.
type span struct {
	start, end int
	match      bool
}

// pattern finds the pieces of a string that a Split, Replace or Digits component acts on:
// the matches and the gaps between them, in order, covering the whole string.
type pattern interface {
	spans(s string) []span
}

// patternJSON is tokenizer.json's {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func parsePattern(raw json.RawMessage) (pattern, error) {
	var p patternJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("pattern %s: %w", raw, err)
	}
	switch {
	case p.String != nil:
		return literalPattern(*p.String), nil
	case p.Regex != nil:
		return compileRegex(*p.Regex)
	}
	return nil, fmt.Errorf("pattern %s: want {\"String\": ...} or {\"Regex\": ...}", raw)
}

// literalPattern matches every non-overlapping occurrence of a fixed string.
type literalPattern string

func (p literalPattern) spans(s string) []span {
	if p == "" {
		return []span{{0, len(s), false}}
	}
	var out []span
	prev := 0
	for {
		i := strings.Index(s[prev:], string(p))
		if i < 0 {
			break
		}
		start := prev + i
		if start > prev {
			out = append(out, span{prev, start, false})
		}
		prev = start + len(p)
		out = append(out, span{start, prev, true})
	}
	if prev < len(s) {
		out = append(out, span{prev, len(s), false})
	}
	return out
}

// regexPattern runs an Oniguruma-style pattern (lookaround included, which Go's RE2 lacks) with
// regexp2. regexp2 reports rune positions; spans are converted back to byte offsets.
type regexPattern struct {
	re *regexp2.Regexp
}

func compileRegex(expr string) (*regexPattern, error) {
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", expr, err)
	}
	return &regexPattern{re: re}, nil
}

func (p *regexPattern) spans(s string) []span {
	if s == "" {
		return []span{{0, 0, false}}
	}
	runes := []rune(s)
	byteAt := runeByteOffsets(s, len(runes))
	var out []span
	prev := 0
	m, err := p.re.FindRunesMatch(runes)
	for ; m != nil && err == nil; m, err = p.re.FindNextMatch(m) {
		start, end := byteAt[m.Index], byteAt[m.Index+m.Length]
		if start > prev {
			out = append(out, span{prev, start, false})
		}
		out = append(out, span{start, end, true})
		prev = end
	}
	if prev < len(s) {
		out = append(out, span{prev, len(s), false})
	}
	return out
}

// runeByteOffsets returns the byte offset of every rune of s, plus len(s) at the end.
func runeByteOffsets(s string, runeCount int) []int {
	at := make([]int, 0, runeCount+1)
	for i := range s {
		at = append(at, i)
	}
	return append(at, len(s))
}

// runePattern matches single runes that satisfy a predicate; each rune is its own match.
type runePattern func(rune) bool

func (p runePattern) spans(s string) []span {
	var out []span
	prev := 0
	for i, r := range s {
		if !p(r) {
			continue
		}
		end := i + utf8.RuneLen(r)
		if i > prev {
			out = append(out, span{prev, i, false})
		}
		out = append(out, span{i, end, true})
		prev = end
	}
	if prev < len(s) {
		out = append(out, span{prev, len(s), false})
	}
	return out
}

// behavior says what a split does with the matched delimiters.
type behavior int

const (
	removed behavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

func parseBehavior(name string) (behavior, error) {
	switch name {
	case "Removed":
		return removed, nil
	case "Isolated":
		return isolated, nil
	case "MergedWithPrevious":
		return mergedWithPrevious, nil
	case "MergedWithNext":
		return mergedWithNext, nil
	case "Contiguous":
		return contiguous, nil
	}
	return 0, fmt.Errorf("unknown split behavior %q", name)
}

// splitSpans cuts s at the spans as the reference's NormalizedString.split does. It returns the
// byte ranges of the non-empty pieces.
func splitSpans(spans []span, b behavior) []span {
	var out []span
	switch b {
	case removed:
		for _, sp := range spans {
			if !sp.match {
				out = append(out, sp)
			}
		}
	case isolated:
		out = spans
	case mergedWithPrevious:
		previousMatch := false
		for _, sp := range spans {
			if sp.match && !previousMatch && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, sp)
			}
			previousMatch = sp.match
		}
	case mergedWithNext:
		previousMatch := false
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !previousMatch && len(out) > 0 {
				out[len(out)-1].start = sp.start
			} else {
				out = append(out, sp)
			}
			previousMatch = sp.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	case contiguous:
		for i, sp := range spans {
			if i > 0 && sp.match == spans[i-1].match {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, sp)
			}
		}
	}
	nonEmpty := out[:0:0]
	for _, sp := range out {
		if sp.end > sp.start {
			nonEmpty = append(nonEmpty, sp)
		}
	}
	return nonEmpty
}

// invertSpans swaps matches and gaps (Split's "invert").
func invertSpans(spans []span) []span {
	out := make([]span, len(spans))
	for i, sp := range spans {
		out[i] = span{sp.start, sp.end, !sp.match}
	}
	return out
}
