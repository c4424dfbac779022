package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"
)

// FuzzEncode encodes arbitrary input with every fixture: no panic, every id has a token, and the
// byte-level tokenizers without a normalizer give valid UTF-8 input back exactly.
func FuzzEncode(f *testing.F) {
	data, err := os.ReadFile("testdata/oracle.json")
	if err != nil {
		f.Fatal(err)
	}
	var o struct {
		Fixtures map[string][]oracleCase `json:"fixtures"`
	}
	if err := json.Unmarshal(data, &o); err != nil {
		f.Fatal(err)
	}
	for _, c := range o.Fixtures["llama3"] {
		f.Add(c.Text)
	}
	f.Add("\xff\xfe invalid \xe2\x82 utf8")
	f.Add("<|begin_of_text|><|begin_of_text|>   <s></s><mask>[SEP]")

	lossless := map[string]bool{"llama3": true, "tiny": true}
	tokenizers := map[string]*Tokenizer{}
	for name := range o.Fixtures {
		tokenizers[name] = mustLoad(f, filepath.Join("testdata", name+".json"))
	}
	tokenizers["tiny"] = mustLoad(f, "../testdata/models/tiny/tokenizer.json")

	f.Fuzz(func(t *testing.T, text string) {
		for name, tok := range tokenizers {
			ids := tok.EncodeWith(text, EncodeOptions{AddSpecial: true})
			for _, id := range ids {
				if _, ok := tok.Token(id); !ok {
					t.Fatalf("%s: Encode(%q) gave id %d, which has no token", name, text, id)
				}
			}
			if lossless[name] && utf8.ValidString(text) {
				if back := tok.Decode(tok.Encode(text)); back != text {
					t.Fatalf("%s: Decode(Encode(%q)) = %q", name, text, back)
				}
			}
		}
	})
}

func mustLoad(f *testing.F, path string) *Tokenizer {
	tok, err := Load(path)
	if err != nil {
		f.Fatal(err)
	}
	return tok
}

// FuzzFromJSON feeds mangled tokenizer.json files to the loader: it must return an error or a
// tokenizer that encodes without panicking.
func FuzzFromJSON(f *testing.F) {
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
		"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"},
		"decoder": {"type": "Strip", "content": " ", "start": -1, "stop": 3}}`))
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 4000000000}, "merges": [["a", "a"]]}}`))
	for _, name := range []string{"llama3", "spm_prepend"} {
		data, err := os.ReadFile(filepath.Join("testdata", name+".json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := FromJSON(data)
		if err != nil {
			return
		}
		ids := tok.EncodeWith("Hello  wörld 123 <s> 👋\n", EncodeOptions{AddSpecial: true})
		tok.Decode(append(ids, -1, tok.VocabSize()))
	})
}
