package packing

import (
	"maps"
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
func BenchmarkPackQPack(b *testing.B) { benchPack(b, QPack{}, 2, 3, 4, 8) }

// BenchmarkUnpackQPack unpacks what BenchmarkPackQPack packs (codes, scales and zeros); bytes/s
// counts output codes.
func BenchmarkUnpackQPack(b *testing.B) { benchUnpack(b, QPack{}, 2, 3, 4, 8) }

// BenchmarkPackCompressed and BenchmarkUnpackCompressed are the same for compressed-tensors'
// pack-quantized layout (32-bit words).
func BenchmarkPackCompressed(b *testing.B)   { benchPack(b, CompressedTensors{}, 4, 8) }
func BenchmarkUnpackCompressed(b *testing.B) { benchUnpack(b, CompressedTensors{}, 4, 8) }

// benchWeights is an 11008×4096 int<bits>-g128-asym weight of random codes for each width.
func benchWeights(b *testing.B, f Format, widths []int) []*quant.Tensor {
	rng := rand.New(rand.NewPCG(1, 1))
	var ts []*quant.Tensor
	for _, bits := range widths {
		s := quant.Scheme{Grid: quant.Integer, Bits: bits, GroupSize: 128}
		if err := f.Supports(s); err != nil {
			b.Fatal(err)
		}
		ts = append(ts, randomTensor(rng, s, 11008, 4096, false))
	}
	return ts
}

func benchPack(b *testing.B, f Format, widths ...int) {
	for _, x := range benchWeights(b, f, widths) {
		b.Run(x.Scheme.String(), func(b *testing.B) {
			b.SetBytes(int64(x.N * x.K))
			for b.Loop() {
				if _, err := f.Pack("p", x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchUnpack(b *testing.B, f Format, widths ...int) {
	for _, x := range benchWeights(b, f, widths) {
		raws, err := f.Pack("p", x)
		if err != nil {
			b.Fatal(err)
		}
		meta := map[string]string{SchemeKey + ".p": x.Scheme.String()} // what a checkpoint's config gives the layouts that keep none
		maps.Copy(meta, f.Metadata("p", x))
		b.Run(x.Scheme.String(), func(b *testing.B) {
			b.SetBytes(int64(x.N * x.K))
			for b.Loop() {
				if _, err := f.Unpack("p", byName(raws), meta); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUnpackGPTQ unpacks GPTQ's qweight, qzeros and scales of an 11008×4096 weight (reading
// an AutoGPTQ checkpoint) at 2, 3, 4 and 8 bits.
func BenchmarkUnpackGPTQ(b *testing.B) { benchUnpack(b, GPTQ{}, 2, 3, 4, 8) }

// BenchmarkPackAWQ and BenchmarkUnpackAWQ are the same for AutoAWQ's GEMM layout (4-bit).
func BenchmarkPackAWQ(b *testing.B)   { benchPack(b, AWQ{}, 4) }
func BenchmarkUnpackAWQ(b *testing.B) { benchUnpack(b, AWQ{}, 4) }

// BenchmarkPackGPTQWidths packs an 11008×4096 int<b>-g128-asym weight into the GPTQ layout at 2,
// 3, 4 and 8 bits.
func BenchmarkPackGPTQWidths(b *testing.B) { benchPack(b, GPTQ{}, 2, 3, 4, 8) }
