package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// toLowerLikeRust lowercases as Rust's str::to_lowercase does, which the reference Lowercase
// normalizer uses. It differs from strings.ToLower in the two context rules of Unicode's
// SpecialCasing that apply without a language: "İ" becomes "i̇", and a capital sigma at the end
// of a word becomes the final form "ς" rather than "σ".
func toLowerLikeRust(s string) string {
	if !strings.ContainsAny(s, "Σİ") {
		return strings.ToLower(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	for i, r := range s {
		switch r {
		case 'İ':
			b.WriteString("i\u0307")
		case 'Σ':
			if isWordFinalSigma(s, i) {
				b.WriteRune('ς')
			} else {
				b.WriteRune('σ')
			}
		default:
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

// isWordFinalSigma is Unicode's Final_Sigma condition for the sigma at byte i: a cased letter
// comes before it and none after it, skipping case-ignorable characters on both sides.
func isWordFinalSigma(s string, i int) bool {
	return casedBefore(s[:i]) && !casedAfter(s[i+len("Σ"):])
}

func casedBefore(s string) bool {
	for len(s) > 0 {
		r, size := utf8.DecodeLastRuneInString(s)
		if !isCaseIgnorable(r) {
			return isCased(r)
		}
		s = s[:len(s)-size]
	}
	return false
}

func casedAfter(s string) bool {
	for _, r := range s {
		if !isCaseIgnorable(r) {
			return isCased(r)
		}
	}
	return false
}

func isCased(r rune) bool {
	return unicode.IsLower(r) || unicode.IsUpper(r) || unicode.IsTitle(r) ||
		unicode.In(r, unicode.Other_Lowercase, unicode.Other_Uppercase)
}

// isCaseIgnorable approximates Unicode's Case_Ignorable: marks, format characters, modifiers and
// the word-internal punctuation of Word_Break MidLetter, MidNumLet and Single_Quote.
func isCaseIgnorable(r rune) bool {
	switch r {
	case '\'', '.', ':', '·', '\u0387', '\u05F4', '\u2018', '\u2019', '\u2024', '\u2027',
		'\uFE13', '\uFE52', '\uFE55', '\uFF07', '\uFF0E', '\uFF1A':
		return true
	}
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk)
}
