package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/internal/testenv"
)

// TestGoldenLlamaQuantize converts the shared mid-llama (every row whole super-blocks) with
// each k-quant preset and Q8_0, Q5_0, Q4_0 by round-to-nearest, with and without llama.cpp's
// importance matrix, and small-llama (rows of 384: Q4_K falls back to Q5_0, Q6_K to Q8_0) with
// the presets whose fallbacks qpack writes, and compares every quantized tensor with
// llama-quantize's (llama.cpp c392e509, from F32 GGUF files of the same BF16 weights;
// testdata/llama-quantize-*.json hold the first 16 hex digits of each tensor's SHA-256; the
// imatrix is llama-imatrix's, in package imatrix's testdata). Every tensor must be
// byte-identical: the decoder linears, token_embd and output.
func TestGoldenLlamaQuantize(t *testing.T) {
	if os.Getenv("QPACK_EVAL") != "1" {
		t.Skip("set QPACK_EVAL=1 for the comparison with llama-quantize on the shared models")
	}
	imat, err := filepath.Abs(filepath.Join("..", "imatrix", "testdata", "mid-llama.imatrix"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model string
		files int
	}{{"mid-llama", 25}, {"small-llama", 5}} {
		src := testenv.Shared(t, "models/"+c.model)
		raw, err := os.ReadFile(filepath.Join("testdata", "llama-quantize-"+c.model+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var want map[string]map[string]string
		if err := json.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		if len(want) != c.files {
			t.Fatalf("%s: %d llama-quantize files in the fixture, want %d", c.model, len(want), c.files)
		}
		for key, hashes := range want {
			preset, withImatrix := strings.CutSuffix(key, "+imatrix")
			opt := DefaultOptions()
			opt.Format, opt.GGUF.Preset = "gguf", preset
			if withImatrix {
				opt.ImatrixFile = imat
			}
			out := filepath.Join(t.TempDir(), "m.gguf")
			if _, err := Convert(src, out, opt); err != nil {
				t.Fatalf("%s %s: %v", c.model, key, err)
			}
			got := tensorHashes(t, out)
			for name, h := range hashes {
				if got[name] != h {
					t.Errorf("%s %s: %s differs from llama-quantize's", c.model, key, name)
				}
			}
			os.Remove(out)
		}
	}
}

// tensorHashes gives the first 16 hex digits of the SHA-256 of each tensor's data.
func tensorHashes(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	for _, ti := range f.Tensors {
		b, err := f.Bytes(ti)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		out[ti.Name] = hex.EncodeToString(sum[:])[:16]
	}
	return out
}
