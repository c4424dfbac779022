package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/blas"
)

func randomFloats(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// relativeError is ‖got − want‖ / ‖want‖, failing the test on an unwritten (NaN) output.
func relativeError(t *testing.T, got, want []float32) float64 {
	t.Helper()
	var diff2, ref2 float64
	for i := range want {
		if math.IsNaN(float64(got[i])) {
			t.Fatalf("output %d not written", i)
		}
		d := float64(got[i]) - float64(want[i])
		diff2 += d * d
		ref2 += float64(want[i]) * float64(want[i])
	}
	return math.Sqrt(diff2 / ref2)
}

// TestMatMulTMatchesFloat64 checks the linear product (package blas's path, bias added) against
// float64 sums, on sizes that are not multiples of the engine's tiles.
func TestMatMulTMatchesFloat64(t *testing.T) {
	t.Logf("matrix path: %+v", blas.Current())
	r := rand.New(rand.NewPCG(5, 6))
	sizes := []struct{ rows, in, out int }{
		{1, 3, 5}, {3, 17, 9}, {65, 33, 67}, {130, 257, 70}, {64, 512, 129}, {7, 1100, 300},
	}
	for _, s := range sizes {
		l := &Linear{In: s.in, Out: s.out, W: randomFloats(r, s.out*s.in), Bias: randomFloats(r, s.out)}
		x := randomFloats(r, s.rows*s.in)
		want := naiveLinear(x, l, s.rows)
		y := make([]float32, s.rows*s.out)
		for i := range y {
			y[i] = float32(math.NaN())
		}
		matMulT(y, x, l.W, l.Bias, s.rows, s.in, s.out)
		if rel := relativeError(t, y, want); !(rel < 1e-5) {
			t.Errorf("%d×%d×%d: relative error %.2e, want < 1e-5", s.rows, s.in, s.out, rel)
		}
	}
}
