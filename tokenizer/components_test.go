package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

func pieceTexts(pieces []piece) []string {
	out := make([]string, len(pieces))
	for i, p := range pieces {
		out[i] = p.text
	}
	return out
}

// The expectations are those of the reference's documentation of SplitDelimiterBehavior.
func TestSplitBehaviors(t *testing.T) {
	cases := []struct {
		behavior behavior
		invert   bool
		want     []string
	}{
		{removed, false, []string{"The", "final", "countdown"}},
		{isolated, false, []string{"The", "-", "final", "-", "-", "countdown"}},
		{mergedWithPrevious, false, []string{"The-", "final-", "-", "countdown"}},
		{mergedWithNext, false, []string{"The", "-final", "-", "-countdown"}},
		{contiguous, false, []string{"The", "-", "final", "--", "countdown"}},
		{removed, true, []string{"-", "-", "-"}},
	}
	for _, c := range cases {
		s := split{literalPattern("-"), c.behavior, c.invert}
		got := pieceTexts(s.preTokenize([]piece{{"The-final--countdown", true}}))
		if !slices.Equal(got, c.want) {
			t.Errorf("behavior %d invert %v: got %q, want %q", c.behavior, c.invert, got, c.want)
		}
	}
}

func TestSplitRegexLookahead(t *testing.T) {
	p, err := compileRegex(`\s+(?!\S)|\s+|\S+`)
	if err != nil {
		t.Fatal(err)
	}
	got := pieceTexts(split{p, isolated, false}.preTokenize([]piece{{"a   b ", true}}))
	// The lookahead leaves the last space of a run to the alternative after it.
	want := []string{"a", "  ", " ", "b", " "}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestDigitsUnicode(t *testing.T) {
	in := []piece{{"x٣٤5½y", true}}
	if got := pieceTexts(digits{true}.preTokenize(in)); !slices.Equal(got, []string{"x", "٣", "٤", "5", "½", "y"}) {
		t.Errorf("individual digits: got %q", got)
	}
	if got := pieceTexts(digits{false}.preTokenize(in)); !slices.Equal(got, []string{"x", "٣٤5½", "y"}) {
		t.Errorf("contiguous digits: got %q", got)
	}
}

func TestMetaspaceSchemes(t *testing.T) {
	cases := []struct {
		m    metaspace
		in   []piece
		want []string
	}{
		{metaspace{"▁", "always", true}, []piece{{"Hey  friend", false}}, []string{"▁Hey", "▁", "▁friend"}},
		{metaspace{"▁", "first", true}, []piece{{"Hey", true}, {"you", false}}, []string{"▁Hey", "you"}},
		{metaspace{"▁", "never", false}, []piece{{" Hey you", true}}, []string{"▁Hey▁you"}},
	}
	for _, c := range cases {
		if got := pieceTexts(c.m.preTokenize(c.in)); !slices.Equal(got, c.want) {
			t.Errorf("%+v on %v: got %q, want %q", c.m, c.in, got, c.want)
		}
	}
}

func TestLowercaseFinalSigma(t *testing.T) {
	cases := map[string]string{
		"ΟΔΟΣ ΣΑ Σ": "οδος σα σ",
		"ΌΣΟΣ.":     "όσος.",
		"İstanbul":  "i\u0307stanbul",
		"ABC":       "abc",
	}
	for in, want := range cases {
		if got := toLowerLikeRust(in); got != want {
			t.Errorf("toLowerLikeRust(%q) = %q, want %q", in, got, want)
		}
	}
}

// Rust's from_utf8_lossy replaces each maximal invalid subsequence with one U+FFFD.
func TestLossyUTF8(t *testing.T) {
	cases := map[string]string{
		"ok":                   "ok",
		"\xff\xfe":             "\uFFFD\uFFFD",
		"\xe2\x82":             "\uFFFD",
		"\xe2\x82a":            "\uFFFDa",
		"\xf0\x9f\x98":         "\uFFFD",
		"\xed\xa0\x80":         "\uFFFD\uFFFD\uFFFD",
		"a\xc3\x28b":           "a\uFFFD(b",
		"\xf0\x9f\x98\x80\xc0": "😀\uFFFD",
	}
	for in, want := range cases {
		if got := lossyUTF8([]byte(in)); got != want {
			t.Errorf("lossyUTF8(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDecoders(t *testing.T) {
	invalid := []string{"a", "<0xE2>", "<0x82>", "<0xFF>", "b"}
	if got := (byteFallbackDecoder{}).decode(invalid); !slices.Equal(got, []string{"a", "\uFFFD", "\uFFFD", "\uFFFD", "b"}) {
		t.Errorf("byte fallback, invalid UTF-8: got %q", got)
	}
	if got := (byteFallbackDecoder{}).decode([]string{"<0xE2>", "<0x82>", "<0xAC>", "x"}); !slices.Equal(got, []string{"€", "x"}) {
		t.Errorf("byte fallback: got %q", got)
	}
	if got := (stripDecoder{' ', 1, 2}).decode([]string{"  a  ", " b", "c   "}); !slices.Equal(got, []string{" a", "b", "c "}) {
		t.Errorf("strip: got %q", got)
	}
	if got := (metaspaceDecoder{'▁', true}).decode([]string{"▁Hey", "▁friend"}); !slices.Equal(got, []string{"Hey", " friend"}) {
		t.Errorf("metaspace: got %q", got)
	}
}

// A hand-made model: unk handling, subword prefix and word suffix.
func TestBPEUnkPrefixSuffix(t *testing.T) {
	const base = `{"model": {"type": "BPE", "unk_token": "[UNK]", "fuse_unk": %s,
		"continuing_subword_prefix": "##", "end_of_word_suffix": "</w>",
		"vocab": {"[UNK]": 0, "a": 1, "##b": 2, "##c</w>": 3, "ab": 4, "abc</w>": 5, "c</w>": 6, "##b</w>": 7},
		"merges": ["a ##b", "ab ##c</w>"]}}`
	cases := []struct {
		fuse, word string
		want       []int
	}{
		{"false", "abc", []int{5}},
		{"false", "ab", []int{1, 7}},
		{"false", "c", []int{6}},
		{"false", "xyab", []int{0, 0, 0, 7}}, // "##a" is not in the vocab
		{"false", "axyc", []int{1, 0, 0, 3}},
		{"true", "axyc", []int{1, 0, 3}},
	}
	for _, c := range cases {
		tok, err := FromJSON([]byte(strings.Replace(base, "%s", c.fuse, 1)))
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.Encode(c.word); !slices.Equal(got, c.want) {
			t.Errorf("fuse_unk %s, %q: got %v, want %v", c.fuse, c.word, got, c.want)
		}
	}
}

func TestAddedTokenOptions(t *testing.T) {
	const cfg = `{"added_tokens": [
		{"id": 10, "content": "cat", "single_word": true, "normalized": false},
		{"id": 11, "content": "<x>", "lstrip": true, "rstrip": true, "normalized": false},
		{"id": 12, "content": "<xy>", "normalized": false}],
		"pre_tokenizer": {"type": "WhitespaceSplit"},
		"model": {"type": "BPE", "vocab": {"c": 0, "a": 1, "t": 2, "s": 3, "y": 4, "<": 5, ">": 6, "x": 7}, "merges": []}}`
	tok, err := FromJSON([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]int{
		"cat cats":  {10, 0, 1, 2, 3}, // "cats" is not a single word match
		"a  <x>  t": {1, 11, 2},       // lstrip and rstrip take the spaces
		"<xy><x>":   {12, 11},         // leftmost longest
		"scat":      {3, 0, 1, 2},
	}
	for in, want := range cases {
		if got := tok.Encode(in); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestUnsupportedComponentsAreNamed(t *testing.T) {
	const model = `"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}`
	cases := map[string]string{
		`{"model": {"type": "WordPiece", "vocab": {}}}`:                                                             `"WordPiece"`,
		`{"model": {"type": "BPE", "dropout": 0.1, "vocab": {}, "merges": []}}`:                                     "dropout",
		`{"normalizer": {"type": "BertNormalizer"}, ` + model + `}`:                                                 `"BertNormalizer"`,
		`{"pre_tokenizer": {"type": "Punctuation"}, ` + model + `}`:                                                 `"Punctuation"`,
		`{"decoder": {"type": "WordPiece"}, ` + model + `}`:                                                         `"WordPiece"`,
		`{"post_processor": {"type": "Mystery"}, ` + model + `}`:                                                    `"Mystery"`,
		`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}`:                                          `"b" is not in the vocab`,
		`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}}`:                                            "not two tokens",
		`{"model": {"type": "BPE", "unk_token": "?", "vocab": {}, "merges": []}}`:                                   "unk_token",
		`{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?<!"}, "behavior": "Isolated"}, ` + model + `}`: "regex",
		`{"pre_tokenizer": {"type": "Split", "pattern": {"String": "-"}, "behavior": "Sideways"}, ` + model + `}`:   "Sideways",
		`not json`: "tokenizer.json",
	}
	for cfg, want := range cases {
		_, err := FromJSON([]byte(cfg))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("FromJSON(%s): error %v, want one mentioning %s", cfg, err, want)
		}
	}
}

func TestVocabLookups(t *testing.T) {
	tok, err := Load("testdata/llama3.json")
	if err != nil {
		t.Fatal(err)
	}
	bos, ok := tok.TokenID("<|begin_of_text|>")
	if !ok || bos != tok.VocabSize()-3 {
		t.Errorf("TokenID(<|begin_of_text|>) = %d, %v; vocab size %d", bos, ok, tok.VocabSize())
	}
	if s, ok := tok.Token(bos); !ok || s != "<|begin_of_text|>" {
		t.Errorf("Token(%d) = %q, %v", bos, s, ok)
	}
	if id, ok := tok.TokenID("Ġ"); !ok || id != 32 {
		t.Errorf("TokenID(Ġ) = %d, %v, want 32 (the byte order id of ' ')", id, ok)
	}
	if _, ok := tok.Token(tok.VocabSize()); ok {
		t.Errorf("Token(VocabSize()) exists")
	}
	if _, ok := tok.Token(-1); ok {
		t.Errorf("Token(-1) exists")
	}
}
