package packing

import (
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// BenchmarkPackGPTQ packs a 4096×11008 int4-g128 weight (a 7B model's down_proj) into the
// GPTQ layout; bytes/s counts input codes (one per weight).
func BenchmarkPackGPTQ(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	x := randomTensor(rng, quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 128, Sym: true}, 4096, 11008, false)
	b.SetBytes(int64(x.N * x.K))
	b.ResetTimer()
	for b.Loop() {
		if _, err := (GPTQ{}).Pack("p", x); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPackQPack packs an 11008×4096 weight (a 7B model's gate_proj) into the qpack layout
// at 2, 3, 4 and 8 bits; bytes/s counts input codes (one per weight).
func BenchmarkPackQPack(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, bits := range []int{2, 3, 4, 8} {
		s := quant.Scheme{Grid: quant.Integer, Bits: bits, GroupSize: 128}
		x := randomTensor(rng, s, 11008, 4096, false)
		b.Run(s.String(), func(b *testing.B) {
			b.SetBytes(int64(x.N * x.K))
			for b.Loop() {
				if _, err := (QPack{}).Pack("p", x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUnpackQPack unpacks what BenchmarkPackQPack packs (the codes, scales and zeros of an
// 11008×4096 weight); bytes/s counts output codes.
func BenchmarkUnpackQPack(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, bits := range []int{2, 3, 4, 8} {
		s := quant.Scheme{Grid: quant.Integer, Bits: bits, GroupSize: 128}
		x := randomTensor(rng, s, 11008, 4096, false)
		f := QPack{}
		raws, err := f.Pack("p", x)
		if err != nil {
			b.Fatal(err)
		}
		get := func(name string) (Raw, bool) {
			for _, r := range raws {
				if r.Name == name {
					return r, true
				}
			}
			return Raw{}, false
		}
		meta := f.Metadata("p", x)
		b.Run(s.String(), func(b *testing.B) {
			b.SetBytes(int64(x.N * x.K))
			for b.Loop() {
				if _, err := f.Unpack("p", get, meta); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
