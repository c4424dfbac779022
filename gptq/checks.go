package gptq

import (
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// checkInputs refuses shapes that do not match, schemes GPTQ cannot use, bad options and
// non-finite or asymmetric inputs, naming the first offending entry.
func checkInputs(w []float32, n, k int, h []float64, s quant.Scheme, opt Options) error {
	if err := checkWeights(w, n, k, s, opt); err != nil {
		return err
	}
	if len(h) != k*k {
		return fmt.Errorf("gptq: Hessian has %d values; a %dx%d weight needs %dx%d = %d", len(h), n, k, k, k, k*k)
	}
	return checkHessian(h, k)
}

// checkWeights is checkInputs without the Hessian.
func checkWeights(w []float32, n, k int, s quant.Scheme, opt Options) error {
	if err := checkWeightShape(w, n, k, s, opt); err != nil {
		return err
	}
	if i := fp.FirstNonFinite(w); i >= 0 {
		return fmt.Errorf("gptq: weight at row %d, column %d is %g", i/k, i%k, w[i])
	}
	return nil
}

// checkWeightShape is checkWeights without the scan for non-finite weights.
func checkWeightShape(w []float32, n, k int, s quant.Scheme, opt Options) error {
	if n <= 0 || k <= 0 {
		return fmt.Errorf("gptq: weight shape %dx%d must be positive", n, k)
	}
	if len(w) != n*k {
		return fmt.Errorf("gptq: %d weights for a %dx%d tensor", len(w), n, k)
	}
	if err := CheckScheme(s, k, opt); err != nil {
		return err
	}
	if opt.Damp < 0 || opt.MaxDamp < 0 || opt.BlockSize < 0 || math.IsNaN(opt.Damp) || math.IsNaN(opt.MaxDamp) {
		return fmt.Errorf("gptq: damping %g, max damping %g and block size %d must not be negative", opt.Damp, opt.MaxDamp, opt.BlockSize)
	}
	return nil
}

// CheckScheme says whether Quantize can quantize rows of k weights to scheme s with opt, before
// any Hessian is gathered: Takes, k-quant rows of whole sub-blocks, IQ and FP4 rows of whole blocks.
func CheckScheme(s quant.Scheme, k int, opt Options) error {
	if err := Takes(s, opt); err != nil {
		return err
	}
	if err := s.CheckRowLength(k); err != nil {
		return fmt.Errorf("gptq: %w", err)
	}
	return nil
}

// Takes says whether GPTQ with opt quantizes to scheme s at all, whatever the tensor: the grid;
// what k-quants cannot do — act-order with super-blocks fitted on the fly (they would follow the
// quantization order, and k-quants have no g_idx to record it) and the clipping search (ggml's
// fit chooses each sub-block's range itself); IQ types code groups of adjacent columns, so
// refuse act-order altogether, and need lazy batches of whole groups; what FP4 cannot do —
// act-order with blocks fitted on the fly (FP4 layouts have no g_idx) and the clipping search
// (the block scale is searched anyway); and a global scale other than NVFP4's.
func Takes(s quant.Scheme, opt Options) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("gptq: %w", err)
	}
	if s.Grid != quant.Integer && s.Grid != quant.NF4 && s.Grid != quant.KQuant && s.Grid != quant.IQuant && !s.IsFP4() {
		return fmt.Errorf("gptq: scheme %s: GPTQ quantizes to integer, NF4, FP4, k-quant and IQ grids, not %s (use blockwise)", s, s.Grid)
	}
	if g := opt.GlobalScale; g != 0 && (s.Grid != quant.NVFP4 || !(g > 0) || math.IsInf(float64(g), 0)) {
		return fmt.Errorf("gptq: global scale %g given for %s (NVFP4 takes a finite positive one, other grids none)", g, s)
	}
	if _, ok := s.IQuant(); ok {
		return takesIQuant(s, opt)
	}
	_, kq := s.KQuant()
	switch {
	case (kq || s.IsFP4()) && opt.ActOrder && !opt.StaticGroups:
		return fmt.Errorf("gptq: %s has no act-order group index (g_idx); use act-order with static groups (--static-groups)", s)
	case kq && opt.Clip && !opt.Imatrix:
		return fmt.Errorf("gptq: %s has no clipping search (--clip); ggml's fit searches each sub-block's range", s)
	case s.IsFP4() && opt.Clip && !opt.Imatrix:
		return fmt.Errorf("gptq: %s has no clipping search (--clip); GPTQ searches each block's scale among the representable ones", s)
	}
	return nil
}

func takesIQuant(s quant.Scheme, opt Options) error {
	switch {
	case opt.ActOrder:
		return fmt.Errorf("gptq: %s codes groups of adjacent columns and has no act-order group index (g_idx); leave --act-order off", s)
	case opt.Clip && !opt.Imatrix:
		return fmt.Errorf("gptq: %s has no clipping search (--clip); ggml's fit searches each sub-block's scale", s)
	case opt.BlockSize%8 != 0:
		return fmt.Errorf("gptq: %s codes groups of 8 columns; the block size %d must be a multiple of 8", s, opt.BlockSize)
	}
	return nil
}

// checkHessian requires finite entries, a non-negative diagonal and symmetry up to float32
// rounding (the factorisation reads both triangles once columns are permuted).
func checkHessian(h []float64, k int) error {
	for i, v := range h {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("gptq: Hessian entry (%d, %d) is %g", i/k, i%k, v)
		}
	}
	for i := range k {
		if h[i*k+i] < 0 {
			return fmt.Errorf("gptq: Hessian diagonal entry (%d, %d) is negative (%g)", i, i, h[i*k+i])
		}
		for j := i + 1; j < k; j++ {
			a, b := h[i*k+j], h[j*k+i]
			if math.Abs(a-b) > 1e-5*math.Sqrt(h[i*k+i]*h[j*k+j]) {
				return fmt.Errorf("gptq: Hessian is not symmetric: (%d, %d) = %g but (%d, %d) = %g", i, j, a, j, i, b)
			}
		}
	}
	return nil
}
