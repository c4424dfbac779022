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

// TestMatMulTMatchesFloat64 checks both paths, the one matMulT picks (OpenBLAS above
// blasMinWork when it is present) and the pure-Go one, against float64 sums, on sizes below and
// above the threshold that are not multiples of the tiles or the register blocks.
func TestMatMulTMatchesFloat64(t *testing.T) {
	if path, ok := blas.Available(); ok {
		t.Logf("OpenBLAS loaded as %s", path)
	} else {
		t.Logf("pure Go only: %v", blas.LoadErr())
	}
	r := rand.New(rand.NewPCG(5, 6))
	sizes := []struct{ rows, in, out int }{
		{1, 3, 5}, {3, 17, 9}, {65, 33, 67}, {130, 257, 70}, {64, 512, 129}, {7, 1100, 300},
	}
	for _, s := range sizes {
		l := &Linear{In: s.in, Out: s.out, W: randomFloats(r, s.out*s.in), Bias: randomFloats(r, s.out)}
		x := randomFloats(r, s.rows*s.in)
		want := naiveLinear(x, l, s.rows)
		paths := map[string]func(y []float32){
			"matMulT": func(y []float32) { matMulT(y, x, l.W, l.Bias, s.rows, s.in, s.out) },
			"matMulTGo": func(y []float32) {
				matMulTGo(y, x, l.W, s.rows, s.in, s.out)
				for i := range y {
					y[i] += l.Bias[i%s.out]
				}
			},
		}
		for name, run := range paths {
			y := make([]float32, s.rows*s.out)
			for i := range y {
				y[i] = float32(math.NaN())
			}
			run(y)
			if rel := relativeError(t, y, want); !(rel < 1e-5) {
				t.Errorf("%s %d×%d×%d: relative error %.2e, want < 1e-5", name, s.rows, s.in, s.out, rel)
			}
		}
	}
}

func benchMatMulGo(b *testing.B, rows, k, n int) {
	r := rand.New(rand.NewPCG(7, 8))
	x, w, y := randomFloats(r, rows*k), randomFloats(r, n*k), make([]float32, rows*n)
	for b.Loop() {
		matMulTGo(y, x, w, rows, k, n)
	}
	b.ReportMetric(2*float64(rows*k*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// The pure-Go path at the sizes of BenchmarkMatMul and blas's BenchmarkSgemmNT.
func BenchmarkMatMulGo512x384x1024(b *testing.B)   { benchMatMulGo(b, 512, 384, 1024) }
func BenchmarkMatMulGo2048x4096x4096(b *testing.B) { benchMatMulGo(b, 2048, 4096, 4096) }
