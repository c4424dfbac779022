package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// A normalizer rewrites the text between added tokens before pre-tokenization.
type normalizer interface {
	normalize(s string) string
}

type unicodeForm struct{ form norm.Form }

func (n unicodeForm) normalize(s string) string { return n.form.String(s) }

type lowercase struct{}

func (lowercase) normalize(s string) string { return toLowerLikeRust(s) }

// prepend adds a fixed prefix to non-empty text (Llama-2's "▁").
type prepend struct{ prefix string }

func (n prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prefix + s
}

// replace substitutes every match of a pattern (Llama-2 turns " " into "▁").
type replace struct {
	pattern pattern
	content string
}

func (n replace) normalize(s string) string {
	var b strings.Builder
	for _, sp := range n.pattern.spans(s) {
		if sp.match {
			b.WriteString(n.content)
		} else {
			b.WriteString(s[sp.start:sp.end])
		}
	}
	return b.String()
}

// strip removes white space at either end.
type strip struct{ left, right bool }

func (n strip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

type normalizerSequence []normalizer

func (seq normalizerSequence) normalize(s string) string {
	for _, n := range seq {
		s = n.normalize(s)
	}
	return s
}

type normalizerJSON struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	Prepend     string            `json:"prepend"`
	Pattern     json.RawMessage   `json:"pattern"`
	Content     string            `json:"content"`
	StripLeft   bool              `json:"strip_left"`
	StripRight  bool              `json:"strip_right"`
}

// parseNormalizer builds a normalizer from tokenizer.json; null gives nil (no normalization).
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c normalizerJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch c.Type {
	case "NFC":
		return unicodeForm{norm.NFC}, nil
	case "NFD":
		return unicodeForm{norm.NFD}, nil
	case "NFKC":
		return unicodeForm{norm.NFKC}, nil
	case "NFKD":
		return unicodeForm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Prepend":
		return prepend{c.Prepend}, nil
	case "Strip":
		return strip{c.StripLeft, c.StripRight}, nil
	case "Replace":
		p, err := parsePattern(c.Pattern)
		if err != nil {
			return nil, fmt.Errorf("normalizer Replace: %w", err)
		}
		return replace{p, c.Content}, nil
	case "Sequence":
		var seq normalizerSequence
		for _, sub := range c.Normalizers {
			n, err := parseNormalizer(sub)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("unsupported normalizer type %q", c.Type)
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
