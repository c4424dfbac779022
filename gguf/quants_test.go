package gguf

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
)

// TestEncodeQ4_0MatchesReference: the AVX2 kernel gives encodeSym's bytes, on random rows and
// on the edge cases (all zero, a negative zero first, ± ties of the largest magnitude, tiny and
// huge values, every tail of a chunk of 256 blocks).
func TestEncodeQ4_0MatchesReference(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(41, 42))
	for _, blocks := range []int{1, 2, 7, 255, 256, 257, 600} {
		x := make([]float32, 32*blocks)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 0.02)
		}
		for b := range blocks {
			blk := x[32*b : 32*b+32]
			switch b % 6 {
			case 1:
				clear(blk)
			case 2:
				clear(blk)
				blk[0] = float32(math.Copysign(0, -1))
			case 3:
				blk[5], blk[9] = 0.5, -0.5 // ties: the first wins
			case 4:
				blk[3], blk[1] = -3e4, 3e4
			case 5:
				for i := range blk {
					blk[i] *= 1e-30
				}
			}
		}
		var want []byte
		for b := range blocks {
			want = encodeSym(want, Q4_0, x[32*b:32*b+32])
		}
		got := encodeQ4_0(make([]byte, 3, 3+18*blocks), x)[3:]
		if !bytes.Equal(got, want) {
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%d blocks: byte %d (block %d) = %#x, reference %#x", blocks, i, i/18, got[i], want[i])
				}
			}
		}
	}
}

func BenchmarkEncodeQ4_0(b *testing.B) {
	x := make([]float32, 32*1024)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	dst := make([]byte, 0, 18*1024)
	b.Run("reference", func(b *testing.B) {
		for b.Loop() {
			dst = dst[:0]
			for i := 0; i < len(x); i += 32 {
				dst = encodeSym(dst, Q4_0, x[i:i+32])
			}
		}
		b.ReportMetric(float64(len(x)*b.N)/b.Elapsed().Seconds()/1e6, "Mweights/s")
	})
	b.Run("avx2", func(b *testing.B) {
		for b.Loop() {
			dst = encodeQ4_0(dst[:0], x)
		}
		b.ReportMetric(float64(len(x)*b.N)/b.Elapsed().Seconds()/1e6, "Mweights/s")
	})
}
