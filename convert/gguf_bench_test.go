package convert

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/internal/synth"
	"github.com/qpack-dev/qpack/internal/testenv"
)

// BenchmarkConvertGGUFQ4KM is `convert --format gguf --preset Q4_K_M` by round-to-nearest of a
// synthetic Llama of 2 blocks with 1024-wide rows and a 32000-token vocabulary (79 M
// parameters, 158 MB of BF16): reading, the k-quant fits, packing, q/k permutation, writing
// and input hashing, on the CPU and (device=cuda, skipped without a GPU) on the GPU. MB/s is
// of BF16 input; compare with llama-quantize on the same file (docs/gguf.md, Speed).
func BenchmarkConvertGGUFQ4KM(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "synth")
	if err := synth.Write(dir, synth.Config{Layers: 2, Hidden: 1024, Intermediate: 2816, Heads: 16, KVHeads: 16, Vocab: 32000, Seed: 3}); err != nil {
		b.Fatal(err)
	}
	tok, err := os.ReadFile(testenv.Testdata(b, "models/tiny/tokenizer.json"))
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644); err != nil {
		b.Fatal(err)
	}
	var in int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			in += info.Size()
		}
	}
	out := filepath.Join(b.TempDir(), "m.gguf")
	for _, device := range []string{DeviceCPU, DeviceCUDA} {
		b.Run("device="+device, func(b *testing.B) {
			if device == DeviceCUDA {
				gputest.Open(b) // skips without a GPU
			}
			opt := DefaultOptions()
			opt.Format, opt.GGUF.Preset, opt.Overwrite, opt.Device = "gguf", "Q4_K_M", true, device
			b.SetBytes(in)
			for b.Loop() {
				if _, err := Convert(dir, out, opt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
