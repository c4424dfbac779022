package gptq

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/quant"
)

// On the FP4 grids GPTQ fits each block when the column loop reaches it (its E4M3 or E8M0
// scale searched, weighted by diag H; NVFP4's global scale fixed beforehand from W) and codes
// each weight to the nearest E2M1 value. Its proxy loss must lie well below round-to-nearest's, plain, with the imatrix
// fit and with static blocks under act-order, and Stats.Loss must be the direct loss.
func TestFP4BeatsRTN(t *testing.T) {
	const n, k = 40, 256
	r := rand.New(rand.NewPCG(7, 41))
	w, h := randomWeights(r, n, k), testHessian(t, r, k)
	diag := make([]float32, k)
	for c := range k {
		diag[c] = float32(h[c*k+c])
	}
	for _, s := range []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme} {
		for _, o := range []Options{{}, {Imatrix: true}, {ActOrder: true, StaticGroups: true, Imatrix: true}} {
			t.Run(fmt.Sprintf("%s/imatrix=%v,act=%v", s, o.Imatrix, o.ActOrder), func(t *testing.T) {
				checkBeatsRTN(t, w, n, k, h, s, o, rtnOptions(o, diag), 0.8)
			})
		}
	}
}

// A given global scale (shared by fused layers) is kept, and the blocks are fitted under it.
func TestNVFP4GPTQGivenGlobalScale(t *testing.T) {
	const n, k = 8, 64
	r := rand.New(rand.NewPCG(8, 41))
	w, h := randomWeights(r, n, k), testHessian(t, r, k)
	g := quant.NVFP4GlobalScale(0.5)
	gt, _, err := Quantize(w, n, k, h, quant.NVFP4Scheme, Options{GlobalScale: g})
	if err != nil {
		t.Fatal(err)
	}
	if gt.GlobalScale != g {
		t.Errorf("global scale %v, want %v", gt.GlobalScale, g)
	}
	if err := gt.Validate(); err != nil {
		t.Error(err)
	}
}

func TestFP4Refusals(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 41))
	for _, c := range []struct {
		name string
		k    int
		s    quant.Scheme
		opt  Options
		want string
	}{
		{"partial block", 40, quant.NVFP4Scheme, Options{}, "whole blocks"},
		{"act-order on the fly", 64, quant.MXFP4Scheme, Options{ActOrder: true}, "static groups"},
		{"global scale for mxfp4", 64, quant.MXFP4Scheme, Options{GlobalScale: 3}, "global scale"},
		{"clip", 64, quant.NVFP4Scheme, Options{Clip: true}, "no clipping search"},
		{"fp8 blocks", 64, quant.FP8BlockScheme(32), Options{}, "not fp8-block"},
	} {
		w, h := randomWeights(r, 4, c.k), testHessian(t, r, c.k)
		if _, _, err := Quantize(w, 4, c.k, h, c.s, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// With a diagonal Hessian no error is fed forward, so GPTQ on an FP4 grid must give exactly
// blockwise's imatrix fit with importance diag H — with or without Options.Imatrix, since
// GPTQ's FP4 blocks always search their scale.
func TestFP4DiagonalHessianIsImatrixRTN(t *testing.T) {
	const n, k = 12, 256
	r := rand.New(rand.NewPCG(10, 41))
	w := randomWeights(r, n, k)
	h, imp := diagonalHessian(r, k)
	for _, s := range []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme} {
		rt, err := blockwise.Quantize(w, n, k, s, blockwise.Options{Imatrix: true, Importance: imp})
		if err != nil {
			t.Fatal(err)
		}
		want := rt.Dequantize(nil)
		for _, o := range []Options{{}, {Imatrix: true}} {
			gt, _, err := Quantize(w, n, k, h, s, o)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range gt.Dequantize(nil) {
				if v != want[i] {
					t.Fatalf("%s, imatrix=%v: weight %d is %g, blockwise's imatrix fit gives %g", s, o.Imatrix, i, v, want[i])
				}
			}
		}
	}
}
