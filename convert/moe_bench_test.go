package convert

import (
	"path/filepath"
	"testing"

	"github.com/qpack-dev/qpack/internal/testenv"
)

// benchGPTQ times the whole GPTQ conversion of a shared model on the CPU with the reference
// calibration (128 × 512 tokens of calib.txt), in input bytes/s and calibration tokens/s.
func benchGPTQ(b *testing.B, name string) {
	src := testenv.Shared(b, "models/"+name)
	opt := GPTQ.DefaultOptions()
	opt.Device, opt.InputHash, opt.Overwrite = DeviceCPU, HashNone, true
	opt.Calib = CalibOptions{File: testenv.Shared(b, "models/calib.txt"), Samples: 128, SeqLen: 512}
	dst := filepath.Join(b.TempDir(), "q")
	for b.Loop() {
		r, err := Convert(src, dst, opt)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(r.InBytes)
	}
	b.ReportMetric(float64(128*512*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkGPTQTinyMoE against BenchmarkGPTQSmallLlama: a mixture of experts of 8.1 M parameters
// (8 experts, top 2) against a dense model of 12.6 M, both calibrated on the same tokens
// (docs/moe.md).
func BenchmarkGPTQTinyMoE(b *testing.B)    { benchGPTQ(b, "tiny-moe") }
func BenchmarkGPTQSmallLlama(b *testing.B) { benchGPTQ(b, "small-llama") }
