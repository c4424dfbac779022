package gptq

import (
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// The importance-weighted group fitting (Options.Imatrix, diag H as importance) must lower
// GPTQ's proxy loss tr(ΔW H ΔWᵀ) against min-max groups at low bit widths, for on-the-fly,
// static and act-order groups, and its Stats.Loss must still be the direct loss.
func TestWeightedGroupsLowerProxyLoss(t *testing.T) {
	const n, k = 48, 256
	r := rand.New(rand.NewPCG(31, 7))
	w, h := randomWeights(r, n, k), testHessian(t, r, k)
	for _, s := range []quant.Scheme{{Bits: 2, GroupSize: 64}, {Bits: 3, GroupSize: 128}, {Bits: 3, GroupSize: 32, Sym: true}, {Bits: 4, GroupSize: quant.PerChannel}} {
		for _, o := range []Options{{}, {StaticGroups: true}, {ActOrder: true}} {
			plain, _, err := Quantize(w, n, k, h, s, o)
			if err != nil {
				t.Fatal(err)
			}
			o.Imatrix = true
			weighted, st, err := Quantize(w, n, k, h, s, o)
			if err != nil {
				t.Fatal(err)
			}
			if err := weighted.Validate(); err != nil {
				t.Fatal(err)
			}
			lp := proxyLoss(w, plain.Dequantize(nil), n, k, h)
			lw := proxyLoss(w, weighted.Dequantize(nil), n, k, h)
			if lw >= 0.98*lp {
				t.Errorf("%s %+v: weighted proxy loss %.4g not 2%% below min-max's %.4g", s, o, lw, lp)
			}
			if d := relDiff(st.Loss, lw); d > 1e-3 {
				t.Errorf("%s %+v: Stats.Loss %g, direct %g", s, o, st.Loss, lw)
			}
			t.Logf("%s static=%v act=%v: weighted/min-max proxy loss %.3f", s, o.StaticGroups, o.ActOrder, lw/lp)
		}
	}
}
