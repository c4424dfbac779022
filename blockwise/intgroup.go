package blockwise

import "github.com/qpack-dev/qpack/quant"

// IntGroupParams returns the scale and zero point that Quantize gives one integer-grid group of
// weights w: min-max (quant.IntParams) or, with clip, the MSE clipping search of Options.Clip
// (imp: optional per-weight importance, len(w)). codes (len ≥ len(w)) is scratch. GPTQ fits its
// groups with it, so both methods share one search.
func IntGroupParams(s quant.Scheme, w, imp []float32, clip bool, codes []uint8) (scale float32, zero uint8) {
	pr := fitGroup(intQuantizer{s}, w, minMax(w), imp, codes[:len(w)], clip)
	return pr.scale, pr.zero
}
