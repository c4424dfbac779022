package blockwise

import (
	"testing"

	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// BenchmarkQuantizePackGPTQ times the CPU path of a converter for a 7B model's down_proj
// (4096×11008 BF16, int4-g128): raw BF16 bytes → QuantizeBF16Into (reused tensor) → GPTQ
// PackInto (reused buffers), each stage alone, and QuantizeBF16PackGPTQ doing both in one pass
// (what the converter runs). Every sub-benchmark counts input BF16 bytes
// (2 per weight), so the MB/s of the stages and of the whole are comparable; the floor
// is 1 GB/s end to end on 2 cores.
func BenchmarkQuantizePackGPTQ(b *testing.B) {
	const n, k = 4096, 11008
	raw := randomBF16(n, k, 1)
	for _, s := range []quant.Scheme{{Bits: 4, GroupSize: 128}, {Bits: 4, GroupSize: 128, Sym: true}, {Bits: 4, GroupSize: 32, Sym: true}} {
		var t quant.Tensor
		var packed []packing.Raw
		quantize := func(b *testing.B) {
			if err := QuantizeBF16Into(&t, raw, n, k, s, Options{}); err != nil {
				b.Fatal(err)
			}
		}
		pack := func(b *testing.B) {
			var err error
			if packed, err = (packing.GPTQ{}).PackInto(packed, "model.layers.0.mlp.down_proj", &t); err != nil {
				b.Fatal(err)
			}
		}
		run := func(name string, stages ...func(*testing.B)) {
			b.Run(s.String()+"/"+name, func(b *testing.B) {
				quantize(b) // warm the buffers, and give pack its input
				pack(b)
				b.SetBytes(int64(len(raw)))
				b.ResetTimer()
				for b.Loop() {
					for _, stage := range stages {
						stage(b)
					}
				}
			})
		}
		var fusedT quant.Tensor
		fused := func(b *testing.B) {
			var err error
			if packed, err = QuantizeBF16PackGPTQ(packed, &fusedT, packing.GPTQ{}, "model.layers.0.mlp.down_proj", raw, n, k, s, Options{}); err != nil {
				b.Fatal(err)
			}
		}
		run("quantize", quantize)
		run("pack", pack)
		run("both", quantize, pack)
		run("fused", fused)
	}
}
