package tokenizer

import "unicode/utf8"

// GPT-2's byte-level alphabet: every byte maps to a printable rune so that any byte string becomes a
// string of visible characters (space becomes 'Ġ', newline 'Ċ'). Printable Latin-1 bytes map to
// themselves; the others map to 256, 257, ... in byte order.
var byteToRune, runeToByte = byteLevelAlphabet()

func byteLevelAlphabet() ([256]rune, map[rune]byte) {
	var toRune [256]rune
	toByte := make(map[rune]byte, 256)
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	next := rune(256)
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !printable(b) {
			r = next
			next++
		}
		toRune[b] = r
		toByte[r] = byte(b)
	}
	return toRune, toByte
}

// byteLevelEncode writes every byte of s as its byte-level rune.
func byteLevelEncode(s string) string {
	out := make([]rune, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = byteToRune[s[i]]
	}
	return string(out)
}

// byteLevelDecode maps the runes of a token back to bytes. Like the reference, a token holding a rune
// outside the alphabet (an added token such as "<|endoftext|>" is inside it; "▁" is not) is kept as
// its own UTF-8 bytes.
func byteLevelDecode(dst []byte, token string) []byte {
	start := len(dst)
	for _, r := range token {
		b, ok := runeToByte[r]
		if !ok {
			return append(dst[:start], token...)
		}
		dst = append(dst, b)
	}
	return dst
}

// lossyUTF8 reads b as UTF-8, replacing each maximal invalid subsequence with U+FFFD, exactly as
// Rust's String::from_utf8_lossy does (Go's strings.ToValidUTF8 would fold a whole run into one).
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	out := make([]byte, 0, len(b)+8)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			out = append(out, b[i:i+size]...)
			i += size
			continue
		}
		out = append(out, "\uFFFD"...)
		i += invalidSubpartLen(b[i:])
	}
	return string(out)
}

// invalidSubpartLen is the length of the longest prefix of b that could start a valid UTF-8
// sequence (Unicode table 3-7), at least 1; b does not start with a valid sequence.
func invalidSubpartLen(b []byte) int {
	lead := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case lead >= 0xC2 && lead <= 0xDF:
		need = 2
	case lead == 0xE0:
		need, lo = 3, 0xA0
	case lead == 0xED:
		need, hi = 3, 0x9F
	case lead >= 0xE1 && lead <= 0xEF:
		need = 3
	case lead == 0xF0:
		need, lo = 4, 0x90
	case lead == 0xF4:
		need, hi = 4, 0x8F
	case lead >= 0xF1 && lead <= 0xF3:
		need = 4
	default:
		return 1
	}
	n := 1
	if n < len(b) && b[n] >= lo && b[n] <= hi {
		n++
		for n < need && n < len(b) && b[n] >= 0x80 && b[n] <= 0xBF {
			n++
		}
	}
	return n
}
