package gptq

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

var int4 = quant.Scheme{Bits: 4, GroupSize: 32, Sym: true}

// TestDeadColumns: channels that never saw input quantize to zero, are counted, and leave the
// rest well quantized.
func TestDeadColumns(t *testing.T) {
	n, k := 32, 96
	r := rand.New(rand.NewPCG(5, 5))
	w, h := randomWeights(r, n, k), testHessian(t, r, k)
	dead := []int{0, 17, 40, 95}
	for _, c := range dead {
		for j := range k {
			h[c*k+j], h[j*k+c] = 0, 0
		}
	}
	for _, opt := range []Options{{BaselineLoss: true}, {ActOrder: true}, {ActOrder: true, StaticGroups: true}} {
		qt, st, err := Quantize(w, n, k, h, int4, opt)
		if err != nil {
			t.Fatal(err)
		}
		if st.DeadColumns != len(dead) {
			t.Errorf("%+v: %d dead columns reported, want %d", opt, st.DeadColumns, len(dead))
		}
		deq := qt.Dequantize(nil)
		for row := range n {
			for _, c := range dead {
				if deq[row*k+c] != 0 {
					t.Fatalf("%+v: dead column %d of row %d dequantizes to %g", opt, c, row, deq[row*k+c])
				}
			}
		}
		if d := relDiff(st.Loss, proxyLoss(w, deq, n, k, h)); d > 1e-3 {
			t.Errorf("%+v: Stats.Loss off by %g", opt, d)
		}
		if opt.BaselineLoss {
			base := proxyLoss(w, make([]float32, n*k), n, k, h) // tr(W H Wᵀ), float64
			if relDiff(st.Baseline, base) > 1e-5 || relDiff(st.RelativeLoss, st.Loss/st.Baseline) > 1e-12 {
				t.Errorf("baseline %g (want %g), relative loss %g", st.Baseline, base, st.RelativeLoss)
			}
		}
	}
}

// householderHessian returns H = I − c·uuᵀ for a random unit u: eigenvalue 1 − c along u, 1
// elsewhere, mean diagonal 1 − c/k.
func householderHessian(r *rand.Rand, k int, c float64) []float64 {
	u := make([]float64, k)
	norm := 0.0
	for i := range u {
		u[i] = r.NormFloat64()
		norm += u[i] * u[i]
	}
	h := make([]float64, k*k)
	for i := range k {
		for j := range k {
			h[i*k+j] = -c * u[i] * u[j] / norm
		}
		h[i*k+i]++
	}
	return h
}

// TestDampingRetry: an indefinite Hessian (one eigenvalue −0.05) fails with damping 0.01 and
// succeeds with 0.1; one with eigenvalue −5 fails up to the maximum, and the error says so.
func TestDampingRetry(t *testing.T) {
	n, k := 16, 64
	r := rand.New(rand.NewPCG(9, 9))
	w := randomWeights(r, n, k)
	_, st, err := Quantize(w, n, k, householderHessian(r, k, 1.05), int4, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Retries != 1 || !slices.Equal(st.FailedDamps, []float64{0.01}) || math.Abs(st.Damp-0.1) > 1e-12 {
		t.Errorf("retries %d, failed %v, damp %g; want 1, [0.01], 0.1", st.Retries, st.FailedDamps, st.Damp)
	}
	_, st, err = Quantize(w, n, k, householderHessian(r, k, 6), int4, Options{})
	if err == nil || !strings.Contains(err.Error(), "damping 1 ") || st.Retries != 3 {
		t.Errorf("hopeless Hessian: err %v after %d retries", err, st.Retries)
	}
	// A singular Hessian (rank 1, every column live) factors once damped.
	u := make([]float64, k)
	for i := range u {
		u[i] = 1 + r.Float64()
	}
	h := make([]float64, k*k)
	for i := range k {
		for j := range k {
			h[i*k+j] = u[i] * u[j]
		}
	}
	if _, st, err = Quantize(w, n, k, h, int4, Options{}); err != nil || st.Retries != 0 {
		t.Errorf("singular Hessian: err %v, %d retries", err, st.Retries)
	}
}

// TestInputErrors: bad inputs are refused with a message that names the problem.
func TestInputErrors(t *testing.T) {
	n, k := 4, 8
	w := make([]float32, n*k)
	h := make([]float64, k*k)
	for i := range k {
		h[i*k+i] = 1
	}
	nan := slices.Clone(w)
	nan[2*k+5] = float32(math.Inf(1))
	hNaN := slices.Clone(h)
	hNaN[3*k+1] = math.NaN()
	hAsym := slices.Clone(h)
	hAsym[1*k+2] = 0.5
	hNeg := slices.Clone(h)
	hNeg[6*k+6] = -1
	cases := []struct {
		name, want string
		w          []float32
		n, k       int
		h          []float64
		s          quant.Scheme
		opt        Options
	}{
		{"weights length", "31 weights for a 4x8", w[:31], n, k, h, int4, Options{}},
		{"hessian length", "Hessian has 63 values", w, n, k, h[:63], int4, Options{}},
		{"shape", "must be positive", w, 0, k, h, int4, Options{}},
		{"inf weight", "row 2, column 5 is +Inf", nan, n, k, h, int4, Options{}},
		{"nan hessian", "entry (3, 1) is NaN", w, n, k, hNaN, int4, Options{}},
		{"asymmetric", "not symmetric", w, n, k, hAsym, int4, Options{}},
		{"negative diagonal", "(6, 6) is negative", w, n, k, hNeg, int4, Options{}},
		{"fp8", "integer, NF4, FP4, k-quant and IQ grids, not fp8", w, n, k, h, quant.Scheme{Bits: 8, GroupSize: quant.PerChannel, Grid: quant.FP8E4M3, Sym: true}, Options{}},
		{"9 bits", "2 to 8 bits", w, n, k, h, quant.Scheme{Bits: 9, GroupSize: 32}, Options{}},
		{"damping", "must not be negative", w, n, k, h, int4, Options{Damp: -1}},
	}
	for _, c := range cases {
		_, _, err := Quantize(c.w, c.n, c.k, c.h, c.s, c.opt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
