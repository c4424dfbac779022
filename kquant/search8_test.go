package kquant

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestScaleMin8Layout: the offsets the assembly hard-codes.
func TestScaleMin8Layout(t *testing.T) {
	want := [...]uintptr{0, 1024, 2048, 3072, 4096, 4352, 4384, 4416, 4448, 4480}
	if scaleMin8Offsets != want {
		t.Fatalf("scaleMin8 field offsets %v, the assembly assumes %v", scaleMin8Offsets, want)
	}
}

// TestFitScaleMin8MatchesScalar: the eight-lane kernel gives fitScaleMin's codes, scales and
// mins bit for bit, for every sweep it serves, on random sub-blocks and on the edge cases
// (all equal, all positive, zeros, zero weights, huge ranges), with fewer than eight lanes too.
func TestFitScaleMin8MatchesScalar(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	r := rand.New(rand.NewPCG(31, 32))
	sweeps := []struct {
		nmax int32
		sw   sweep
	}{{15, refSweeps[4]}, {31, refSweeps[5]}, {15, implSweep}, {31, implSweep}}
	gen := []func(x, w []float32){
		func(x, w []float32) { // weight-like values, ref-style weights
			for i := range x {
				x[i] = float32(r.NormFloat64() * 0.02)
				w[i] = float32(r.Float64())
			}
		},
		func(x, w []float32) { // all equal and negative: a flat lane
			for i := range x {
				x[i], w[i] = -0.5, 1
			}
		},
		func(x, w []float32) { // all positive
			for i := range x {
				x[i], w[i] = float32(1+r.Float64()), float32(r.Float64())
			}
		},
		func(x, w []float32) { // zeros, zero weights
			for i := range x {
				x[i], w[i] = 0, 0
			}
		},
		func(x, w []float32) { // heavy tails, some zero weights
			for i := range x {
				x[i] = float32(math.Pow(r.NormFloat64(), 3) * 100)
				w[i] = float32(r.IntN(2))
			}
		},
	}
	for trial := range 300 {
		sw := sweeps[trial%len(sweeps)]
		nsub := 1 + trial%8
		x, w := make([]float32, 32*nsub), make([]float32, 32*nsub)
		for j := range nsub {
			gen[r.IntN(len(gen))](x[32*j:32*j+32], w[32*j:32*j+32])
		}
		codes := make([]uint8, 32*nsub)
		scales, mins := make([]float32, nsub), make([]float32, nsub)
		if !fitScaleMin8(sw.nmax, x, w, codes, sw.sw, scales, mins) {
			t.Fatal("kernel refused")
		}
		var aux [32]uint8
		for j := range nsub {
			want := make([]uint8, 32)
			s, m := fitScaleMin(sw.nmax, x[32*j:32*j+32], w[32*j:32*j+32], want, aux[:], sw.sw.rmin, sw.sw.rdelta, sw.sw.nstep, false)
			if math.Float32bits(s) != math.Float32bits(scales[j]) || math.Float32bits(m) != math.Float32bits(mins[j]) {
				t.Fatalf("trial %d lane %d: scale, min %g, %g; scalar %g, %g", trial, j, scales[j], mins[j], s, m)
			}
			for i, c := range want {
				if codes[32*j+i] != c {
					t.Fatalf("trial %d lane %d: code %d = %d, scalar %d", trial, j, i, codes[32*j+i], c)
				}
			}
		}
	}
}

func BenchmarkFitScaleMin(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	x, w := make([]float32, 256), make([]float32, 256)
	for i := range x {
		x[i], w[i] = float32(r.NormFloat64()), float32(r.Float64())
	}
	codes := make([]uint8, 256)
	var scales, mins [8]float32
	b.Run("scalar", func(b *testing.B) {
		var aux [32]uint8
		for b.Loop() {
			for j := range 8 {
				scales[j], mins[j] = fitScaleMin(15, x[32*j:32*j+32], w[32*j:32*j+32], codes[32*j:], aux[:], -1, 0.1, 20, false)
			}
		}
	})
	b.Run("avx2x8", func(b *testing.B) {
		for b.Loop() {
			fitScaleMin8(15, x, w, codes, refSweeps[4], scales[:], mins[:])
		}
	})
}
