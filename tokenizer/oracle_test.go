package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// oracleCase is one string of testdata/oracle.json with what the reference JavaScript tokenizer
// made of it (see testdata/gen_oracle.mjs).
type oracleCase struct {
	Text       string `json:"text"`
	IDs        []int  `json:"ids"`
	IDsSpecial []int  `json:"ids_special"`
	Decoded    string `json:"decoded"`
}

func loadOracle(t *testing.T) map[string][]oracleCase {
	data, err := os.ReadFile("testdata/oracle.json")
	if err != nil {
		t.Fatal(err)
	}
	var o struct {
		Fixtures map[string][]oracleCase `json:"fixtures"`
	}
	if err := json.Unmarshal(data, &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Fixtures) == 0 {
		t.Fatal("testdata/oracle.json has no fixtures")
	}
	return o.Fixtures
}

// oracleDivergences are cases where the JavaScript oracle departs from the Rust reference, which
// this package follows; the Rust behaviour is checked by the named test instead.
var oracleDivergences = map[string]string{
	"gpt2_extras/numbers 1234567 3.14159 1,000,000 2026-11-21 ٣٤٥ ①② ½": "JS Digits splits on \\d (ASCII), " +
		"Rust on char::is_numeric (Unicode N); see TestDigitsUnicode",
}

func TestMatchesOracle(t *testing.T) {
	for name, cases := range loadOracle(t) {
		t.Run(name, func(t *testing.T) {
			tok, err := Load(filepath.Join("testdata", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cases {
				if why, ok := oracleDivergences[name+"/"+c.Text]; ok {
					t.Logf("skipping %q: %s", c.Text, why)
					continue
				}
				if got := tok.Encode(c.Text); !slices.Equal(got, c.IDs) {
					t.Errorf("Encode(%q)\n got %v\nwant %v", c.Text, got, c.IDs)
				}
				if got := tok.EncodeWith(c.Text, EncodeOptions{AddSpecial: true}); !slices.Equal(got, c.IDsSpecial) {
					t.Errorf("Encode(%q, AddSpecial)\n got %v\nwant %v", c.Text, got, c.IDsSpecial)
				}
				if got := tok.Decode(c.IDs); got != c.Decoded {
					t.Errorf("Decode(ids of %q) = %q, want %q", c.Text, got, c.Decoded)
				}
			}
		})
	}
}

// Byte-level tokenizers lose nothing: decoding the ids gives the text back.
func TestByteLevelRoundTrip(t *testing.T) {
	cases := loadOracle(t)["llama3"]
	tok, err := Load("testdata/llama3.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if got := tok.Decode(tok.Encode(c.Text)); got != c.Text {
			t.Errorf("Decode(Encode(%q)) = %q", c.Text, got)
		}
	}
}
