package blockwise

import "github.com/qpack-dev/qpack/quant"

// GroupParams returns the scale and, on the integer grid, the zero point that Quantize gives
// one group of weights w of an integer, NF4 or FP4 scheme: the plain fit (min-max, absmax) or
// the search opt asks for (Clip, Imatrix; imp: optional per-weight importance, len(w),
// opt.Importance is ignored). An NVFP4 block is fitted under opt.GlobalScale, which must be
// set. codes (len ≥ len(w)) is scratch. GPTQ fits its groups with it, so both methods share one
// search.
func GroupParams(s quant.Scheme, w, imp []float32, opt Options, codes []uint8) (scale float32, zero uint8) {
	if s.Grid == quant.NVFP4 && opt.GlobalScale == 0 {
		panic("blockwise: GroupParams of an NVFP4 block needs the tensor's global scale")
	}
	pr := fitGroup(quantizerFor(s, opt.GlobalScale), w, minMax(w), imp, codes[:len(w)], opt)
	return pr.scale, pr.zero
}
