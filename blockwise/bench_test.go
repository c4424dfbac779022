package blockwise

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// randomBF16 returns n×k Gaussian weights (σ = 0.02) as raw little-endian BF16 bytes.
func randomBF16(n, k int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	raw := make([]byte, 2*n*k)
	for i := range n * k {
		binary.LittleEndian.PutUint16(raw[2*i:], fp.F32ToBF16(float32(r.NormFloat64()*0.02)))
	}
	return raw
}

func benchmarkBF16(b *testing.B, n, k int, s quant.Scheme, opt Options) {
	raw := randomBF16(n, k, 1)
	var t quant.Tensor
	b.SetBytes(int64(len(raw)))
	b.ResetTimer()
	for b.Loop() {
		if err := QuantizeBF16Into(&t, raw, n, k, s, opt); err != nil {
			b.Fatal(err)
		}
	}
}

// The target: ≥ 1 GB/s of BF16 input for a 4096×11008 int4-g128 RTN on 2 cores.
func BenchmarkBF16Int4G128(b *testing.B) {
	benchmarkBF16(b, 4096, 11008, quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}, Options{})
}

func BenchmarkBF16Int4G128Asym(b *testing.B) {
	benchmarkBF16(b, 4096, 11008, quant.Scheme{Bits: 4, GroupSize: 128}, Options{})
}

func BenchmarkBF16NF4G64(b *testing.B) {
	benchmarkBF16(b, 4096, 11008, quant.Scheme{Bits: 4, GroupSize: 64, Sym: true, Grid: quant.NF4}, Options{})
}

func BenchmarkBF16FP8(b *testing.B) {
	benchmarkBF16(b, 4096, 11008, quant.Scheme{Bits: 8, Sym: true, Grid: quant.FP8E4M3}, Options{})
}

func BenchmarkBF16Int4G128Clip(b *testing.B) {
	benchmarkBF16(b, 256, 4096, quant.Scheme{Bits: 4, GroupSize: 128}, Options{Clip: true})
}

// The importance-weighted search (--imatrix; GPTQ under awq+gptq fits its groups with it).
func BenchmarkBF16Int4G128AsymImatrix(b *testing.B) {
	imp := make([]float32, 4096)
	for i := range imp {
		imp[i] = float32(1 + i%7)
	}
	benchmarkBF16(b, 256, 4096, quant.Scheme{Bits: 4, GroupSize: 128}, Options{Imatrix: true, Importance: imp})
}
