package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/ftype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/internal/testenv"
)

// TestGoldenLlamaQuantize converts the shared mid-llama (every row whole super-blocks) with
// llama.cpp's presets by round-to-nearest — the k-quant ones and Q8_0, Q5_0, Q4_0 with and
// without llama.cpp's importance matrix, the IQ ones (IQ4_NL, IQ4_XS, IQ3_S without it; every IQ
// preset with it: IQ3_XXS and below are refused without one) — and small-llama (rows of 384:
// Q4_K falls back to Q5_0, Q6_K to Q8_0, Q2_K and Q3_K to IQ4_NL), and compares every quantized
// tensor with llama-quantize's (llama.cpp c392e509, from F32 GGUF files of the same BF16
// weights; testdata/llama-quantize-*.json hold the first 16 hex digits of each tensor's SHA-256;
// the imatrix is llama-imatrix's, in package imatrix's testdata). Every tensor must be
// byte-identical — the decoder linears, token_embd and output — except those llama.cpp gives
// Q4_1 or Q5_1 (small-llama's Q5_K fallback under Q3_K_M and Q3_K_L), which qpack writes as
// Q4_0 and Q5_0 (standIns).
//
// The IQ fits take seconds each on two cores, so CI's evaluation step compares the fixtures in
// goldenCI (every IQ type at least once, with and without an imatrix, and an IQ4_NL fallback);
// QPACK_GOLDEN_ALL=1 compares all of them.
func TestGoldenLlamaQuantize(t *testing.T) {
	if os.Getenv("QPACK_EVAL") != "1" {
		t.Skip("set QPACK_EVAL=1 for the comparison with llama-quantize on the shared models")
	}
	imat, err := filepath.Abs(filepath.Join("..", "imatrix", "testdata", "mid-llama.imatrix"))
	if err != nil {
		t.Fatal(err)
	}
	all := os.Getenv("QPACK_GOLDEN_ALL") == "1"
	for _, c := range []struct {
		model string
		files int
	}{{"mid-llama", 39}, {"small-llama", 9}} {
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
			if !all && !goldenCI(c.model, key) {
				continue
			}
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
			ft, err := ftype.Parse(preset)
			if err != nil {
				t.Fatal(err)
			}
			standIn := standInTensors(t, src, ft, withImatrix)
			for name, h := range hashes {
				switch {
				case standIn[name] != 0 && got[name] != "":
					t.Logf("%s %s: %s is a stand-in for llama.cpp's %s", c.model, key, name, standIn[name])
				case got[name] != h:
					t.Errorf("%s %s: %s differs from llama-quantize's", c.model, key, name)
				}
			}
			os.Remove(out)
		}
	}
}

// goldenCI says whether CI's evaluation step compares the fixture: every k-quant and legacy
// preset, and a subset of the slower IQ ones that holds every IQ type.
func goldenCI(model, key string) bool {
	preset, _ := strings.CutSuffix(key, "+imatrix")
	if !strings.HasPrefix(preset, "IQ") && model == "mid-llama" {
		return true
	}
	return slices.Contains([]string{"mid-llama IQ4_NL", "mid-llama IQ3_S", "mid-llama IQ4_XS+imatrix",
		"mid-llama IQ3_XXS+imatrix", "mid-llama IQ2_XXS+imatrix", "mid-llama IQ2_XS+imatrix",
		"mid-llama IQ1_S+imatrix", "mid-llama IQ1_M+imatrix", "mid-llama IQ2_M+imatrix",
		"small-llama Q4_K_M", "small-llama Q6_K", "small-llama Q8_0", "small-llama Q5_0", "small-llama Q4_0",
		"small-llama Q2_K", "small-llama Q3_K_M"}, model+" "+key)
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
