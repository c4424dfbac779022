package vec

import (
	"math"
	"math/rand/v2"
	"testing"
)

// ulps is the distance between two float32 in units in the last place.
func ulps(a, b float32) int64 {
	ia, ib := int64(math.Float32bits(a)), int64(math.Float32bits(b))
	if ia < 0 || ib < 0 { // both of our values are ≥ 0
		return math.MaxInt64
	}
	if ia > ib {
		return ia - ib
	}
	return ib - ia
}

// TestExpMatchesGo compares Exp with expSumGo (float64 exp, rounded) on random arguments over
// the whole range, the clamps, ±Inf and NaN, at lengths that leave tails of every size.
func TestExpMatchesGo(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	src := []float32{0, -0, 1, -1, 88, -87, 88.37, -88.37, 100, -100, float32(math.Inf(1)), float32(math.Inf(-1)), 1e-30, -1e-30}
	for range 100000 {
		src = append(src, float32(r.Float64()*200-100), float32(r.NormFloat64()))
	}
	for _, n := range []int{len(src), 1, 7, 8, 9, 23} {
		in := src[:n]
		got, want := make([]float32, n), make([]float32, n)
		Exp(got, in)
		expSumGo(want, in, 0)
		for i, x := range in {
			limit := int64(2)
			if want[i] < 1e-37 { // near the underflow the kernel flushes to zero
				limit = 1 << 23
			}
			if d := ulps(got[i], want[i]); d > limit {
				t.Fatalf("exp(%g) = %g, want %g (%d ulp)", x, got[i], want[i], d)
			}
		}
	}
	nan := float32(math.NaN())
	out := make([]float32, 9)
	Exp(out, []float32{nan, 0, 0, 0, 0, 0, 0, nan, nan})
	if out[0] == out[0] || out[7] == out[7] || out[8] == out[8] || out[1] != 1 {
		t.Errorf("Exp of NaN: %v, want NaN where the input is NaN and 1 for 0", out)
	}
}

// TestExpSumMaxScale: ExpSum's values are Exp of the shifted input and its sum their float64
// sum; Max and Scale agree with plain loops, at every tail length.
func TestExpSumMaxScale(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for n := range 40 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 5)
		}
		want := float32(math.Inf(-1))
		for _, v := range x {
			want = max(want, v)
		}
		if got := Max(x); got != want {
			t.Fatalf("n %d: Max = %g, want %g", n, got, want)
		}
		shifted := make([]float32, n)
		for i, v := range x {
			shifted[i] = v - want
		}
		e, ref := make([]float32, n), make([]float32, n)
		sum := ExpSum(e, x, want)
		Exp(ref, shifted)
		wantSum := 0.0
		for i := range e {
			if e[i] != ref[i] {
				t.Fatalf("n %d: ExpSum[%d] = %g, Exp of the shifted value %g", n, i, e[i], ref[i])
			}
			wantSum += float64(ref[i])
		}
		if math.Abs(sum-wantSum) > 1e-12*wantSum {
			t.Fatalf("n %d: ExpSum returned %g, values sum to %g", n, sum, wantSum)
		}
		scaled := append([]float32(nil), x...)
		Scale(scaled, 0.37)
		for i, v := range x {
			if scaled[i] != v*0.37 {
				t.Fatalf("n %d: Scale[%d] = %g, want %g", n, i, scaled[i], v*0.37)
			}
		}
	}
}

func BenchmarkExp(b *testing.B) {
	src, dst := make([]float32, 4096), make([]float32, 4096)
	for i := range src {
		src[i] = float32(i%100) - 90
	}
	b.Run("vec", func(b *testing.B) {
		for b.Loop() {
			Exp(dst, src)
		}
		b.ReportMetric(float64(len(src)*b.N)/b.Elapsed().Seconds()/1e9, "Gexp/s")
	})
	b.Run("math", func(b *testing.B) {
		for b.Loop() {
			expSumGo(dst, src, 0)
		}
		b.ReportMetric(float64(len(src)*b.N)/b.Elapsed().Seconds()/1e9, "Gexp/s")
	})
}
