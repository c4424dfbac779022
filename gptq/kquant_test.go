package gptq

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/quant"
)

// On k-quants GPTQ fits each super-block with ggml's algorithm when the column loop reaches it
// and codes every weight with those parameters. Its proxy loss must lie below round-to-nearest's
// (ggml's own fitting, with the same importance) for every type, with the weighted (imatrix) fit
// and with static super-blocks under act-order, on rows of whole super-blocks and on rows whose
// last super-block is short; Stats.Loss must be the directly computed loss.
func TestKQuantBeatsRTN(t *testing.T) {
	for si, k := range []int{512, 384} {
		const n = 40
		r := rand.New(rand.NewPCG(uint64(si), 41))
		w, h := randomWeights(r, n, k), testHessian(t, r, k)
		diag := make([]float32, k)
		for c := range k {
			diag[c] = float32(h[c*k+c])
		}
		for _, s := range quant.KQuantSchemes() {
			for _, o := range []Options{{}, {Imatrix: true}, {ActOrder: true, StaticGroups: true, Imatrix: true}} {
				t.Run(fmt.Sprintf("K%d/%s/weighted=%v,act=%v", k, s, o.Imatrix, o.ActOrder), func(t *testing.T) {
					checkBeatsRTN(t, w, n, k, h, s, o, rtnOptions(o, diag), 0.9)
				})
			}
		}
	}
}

// checkBeatsRTN quantizes W[n, k] to s with GPTQ (o) and with round-to-nearest (bopt): GPTQ's
// proxy loss must be below `below` times RTN's, Stats.Loss the directly computed loss, and the
// tensor valid and without a g_idx. It returns GPTQ's tensor.
func checkBeatsRTN(t *testing.T, w []float32, n, k int, h []float64, s quant.Scheme, o Options, bopt blockwise.Options, below float64) *quant.Tensor {
	t.Helper()
	gt, st, err := Quantize(w, n, k, h, s, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := gt.Validate(); err != nil {
		t.Fatal(err)
	}
	if gt.GIdx != nil {
		t.Fatalf("a %s tensor got a g_idx", s)
	}
	rt, err := blockwise.Quantize(w, n, k, s, bopt)
	if err != nil {
		t.Fatal(err)
	}
	if gt.GlobalScale != rt.GlobalScale {
		t.Errorf("global scale %v, RTN's %v (both from W)", gt.GlobalScale, rt.GlobalScale)
	}
	gLoss := proxyLoss(w, gt.Dequantize(nil), n, k, h)
	rLoss := proxyLoss(w, rt.Dequantize(nil), n, k, h)
	if gLoss >= below*rLoss {
		t.Errorf("GPTQ proxy loss %.4g not below %g × RTN's %.4g", gLoss, below, rLoss)
	}
	if d := relDiff(st.Loss, gLoss); d > 1e-3 {
		t.Errorf("Stats.Loss %g, direct tr(ΔW H ΔWᵀ) %g (rel. diff %g)", st.Loss, gLoss, d)
	}
	t.Logf("GPTQ/RTN proxy loss %.3f", gLoss/rLoss)
	return gt
}

// rtnOptions is the round-to-nearest that GPTQ with o is compared with: importance diag H when
// o weighs by importance.
func rtnOptions(o Options, diag []float32) blockwise.Options {
	if !o.Imatrix {
		return blockwise.Options{}
	}
	return blockwise.Options{Imatrix: true, Importance: diag}
}

// With a diagonal Hessian no error is fed forward, so GPTQ must give exactly what ggml's
// round-to-nearest fitting gives with importance diag H: the same super-block scales, sub-block
// scales and mins, and the same dequantized weights. This pins the super-block positions, the
// fits and the per-weight rounding to the k-quant reference.
func TestKQuantDiagonalHessianIsRTN(t *testing.T) {
	const n, k = 12, 640 // two whole super-blocks and a short one
	r := rand.New(rand.NewPCG(5, 5))
	w := randomWeights(r, n, k)
	h, imp := diagonalHessian(r, k)
	for _, s := range quant.KQuantSchemes() {
		for _, o := range []Options{{}, {Imatrix: true}, {StaticGroups: true}} {
			gt, _, err := Quantize(w, n, k, h, s, o)
			if err != nil {
				t.Fatal(err)
			}
			bopt := blockwise.Options{Imatrix: o.Imatrix}
			if o.Imatrix {
				bopt.Importance = imp
			}
			rt, err := blockwise.Quantize(w, n, k, s, bopt)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				what string
				a, b any
			}{{"d", gt.Scales, rt.Scales}, {"dmin", gt.Mins, rt.Mins}, {"sub-block scales", gt.SubScales, rt.SubScales},
				{"sub-block mins", gt.SubMins, rt.SubMins}, {"dequantized weights", gt.Dequantize(nil), rt.Dequantize(nil)}} {
				if fmt.Sprint(c.a) != fmt.Sprint(c.b) {
					t.Errorf("%s %+v: %s differ from round-to-nearest's", s, o, c.what)
				}
			}
		}
	}
}

// What GPTQ cannot do with k-quants is refused by name: rows of partial sub-blocks, act-order
// with super-blocks fitted on the fly, and the clip search.
func TestKQuantRefusals(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	q4, _ := quant.KQuantScheme(4)
	for _, c := range []struct {
		k    int
		opt  Options
		want string
	}{
		{k: 48, want: "sub-blocks of 32"},
		{k: 256, opt: Options{ActOrder: true}, want: "static groups"},
		{k: 256, opt: Options{Clip: true}, want: "clipping"},
	} {
		w, h := randomWeights(r, 8, c.k), testHessian(t, r, c.k)
		_, _, err := Quantize(w, 8, c.k, h, q4, c.opt)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "q4_k") {
			t.Errorf("K=%d %+v: error %v; want one naming q4_k and %q", c.k, c.opt, err, c.want)
		}
	}
}

// diagonalHessian returns a k×k diagonal Hessian with entries in [0.5, 4.5), skewed low, and its
// diagonal as importance: no error is fed forward under it.
func diagonalHessian(r *rand.Rand, k int) (h []float64, imp []float32) {
	h = make([]float64, k*k)
	imp = make([]float32, k)
	for c := range k {
		imp[c] = float32(0.5 + r.Float64()*r.Float64()*4)
		h[c*k+c] = float64(imp[c])
	}
	return h, imp
}
