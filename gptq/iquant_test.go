package gptq

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/quant"
)

// On IQ types GPTQ fits each block with ggml's algorithm when the column loop reaches it and
// codes each group of 8 (each weight for iq4) from its updated weights. Its proxy loss must lie
// well below round-to-nearest's (ggml's own fit, importance diag H) for every type (the block
// fits take diag H with or without Imatrix); Stats.Loss must be the directly computed loss.
func TestIQuantBeatsRTN(t *testing.T) {
	const n, k = 24, 512
	r := rand.New(rand.NewPCG(7, 41))
	w, h := randomWeights(r, n, k), testHessian(t, r, k)
	diag := make([]float32, k)
	for c := range k {
		diag[c] = float32(h[c*k+c])
	}
	for _, it := range quant.IQTypes() {
		s, _ := quant.IQuantScheme(it)
		t.Run(s.String(), func(t *testing.T) {
			checkBeatsRTN(t, w, n, k, h, s, Options{}, blockwise.Options{Imatrix: true, Importance: diag}, 0.9)
		})
	}
}

// With a diagonal Hessian no error is fed forward: GPTQ must fit the blocks exactly as ggml's
// round-to-nearest with importance diag H does (same d and sub-block scales, and for iq1_s the
// same δ), and code every group at least as well as ggml did, by its own cost H_jj + λ.
func TestIQuantDiagonalHessian(t *testing.T) {
	const n, k = 6, 512
	r := rand.New(rand.NewPCG(9, 9))
	w := randomWeights(r, n, k)
	h, imp := diagonalHessian(r, k)
	for _, it := range quant.IQTypes() {
		s, _ := quant.IQuantScheme(it)
		gt, st, err := Quantize(w, n, k, h, s, Options{Imatrix: true})
		if err != nil {
			t.Fatal(err)
		}
		lambda := st.Lambda
		rt, err := blockwise.Quantize(w, n, k, s, blockwise.Options{Imatrix: true, Importance: imp})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(gt.Scales, rt.Scales) || !slices.Equal(gt.SubScales, rt.SubScales) {
			t.Errorf("%s: GPTQ's block scales differ from RTN's", s)
		}
		if it == quant.IQ1S && !slices.Equal(gt.Signs, rt.Signs) {
			t.Errorf("%s: GPTQ's δ signs differ from RTN's", s)
		}
		gv, rv := gt.Dequantize(nil), rt.Dequantize(nil)
		for g := 0; g < n*k; g += 8 {
			var ge, re float64
			for j := g; j < g+8; j++ {
				c := float64(imp[j%k]) + lambda
				ge += c * float64(w[j]-gv[j]) * float64(w[j]-gv[j])
				re += c * float64(w[j]-rv[j]) * float64(w[j]-rv[j])
			}
			if ge > re*(1+1e-4)+1e-12 {
				t.Fatalf("%s: group at %d: GPTQ's weighted error %g above RTN's %g", s, g, ge, re)
			}
		}
	}
}

func TestIQuantRefusals(t *testing.T) {
	s, _ := quant.IQuantScheme(quant.IQ2S)
	for _, c := range []struct {
		opt  Options
		k    int
		want string
	}{
		{Options{ActOrder: true, StaticGroups: true}, 256, "leave --act-order off"},
		{Options{Clip: true}, 256, "no clipping search"},
		{Options{BlockSize: 100}, 256, "multiple of 8"},
		{Options{}, 320, "whole blocks of 256"},
	} {
		if err := CheckScheme(s, c.k, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v K=%d: %v, want an error containing %q", c.opt, c.k, err, c.want)
		}
	}
}
