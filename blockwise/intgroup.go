package blockwise

import "github.com/qpack-dev/qpack/quant"

// IntGroupParams returns the scale and zero point that Quantize gives one integer-grid group of
// weights w: min-max (quant.IntParams) or the search opt asks for (Clip, Weighted; imp:
// optional per-weight importance, len(w), opt.Importance is ignored). codes (len ≥ len(w)) is
// scratch. GPTQ fits its groups with it, so both methods share one search.
func IntGroupParams(s quant.Scheme, w, imp []float32, opt Options, codes []uint8) (scale float32, zero uint8) {
	pr := fitGroup(intQuantizer{s}, w, minMax(w), imp, codes[:len(w)], opt)
	return pr.scale, pr.zero
}
