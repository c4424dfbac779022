package quant

import (
	"math"

	"github.com/qpack-dev/qpack/fp"
)

// MinF16Scale is the smallest positive F16 value (2^−24): the scale given to groups whose
// natural scale rounds to zero in F16, so that every stored scale is non-zero.
var MinF16Scale = fp.F16ToF32(1)

// BinaryParams computes the parameters of one binary (INT1) group, w ≈ offset + scale·(±1).
// Symmetric: offset 0 and scale mean|w|, the scale that minimises the squared error of sign
// codes. Asymmetric: offset mean(w), then scale mean|w − offset| with the F16-rounded offset.
// Both are rounded to F16 before codes are computed; a scale that rounds to 0 becomes the
// smallest F16 subnormal. Means are accumulated in float64.
func BinaryParams(w []float32, sym bool) (scale, offset float32) {
	if len(w) == 0 {
		return 1, 0
	}
	if !sym {
		var sum float64
		for _, v := range w {
			sum += float64(v)
		}
		offset = RoundF16(float32(sum / float64(len(w))))
	}
	var sumAbs float64
	for _, v := range w {
		sumAbs += math.Abs(float64(v - offset))
	}
	scale = RoundF16(float32(sumAbs / float64(len(w))))
	if scale == 0 {
		scale = MinF16Scale
	}
	return scale, offset
}

// BinaryCode returns 1 (+1) when w ≥ offset and 0 (−1) otherwise; a weight exactly at the
// offset goes to +1.
func BinaryCode(w, offset float32) uint8 {
	if w-offset >= 0 {
		return 1
	}
	return 0
}

// FP8MaxE4M3 is the largest finite E4M3FN value.
const FP8MaxE4M3 = 448

// FP8Scale returns the float32 scale of one FP8 output channel: absmax/448, so that the
// channel's largest weight maps to E4M3's largest value. An all-zero row (or one whose absmax/448
// underflows float32) gets scale 1; its codes are all zero.
func FP8Scale(absmax float32) float32 {
	s := absmax / FP8MaxE4M3
	if s == 0 {
		return 1
	}
	return s
}

// DequantizeBinary returns offset + scale·(2q − 1).
func DequantizeBinary(q uint8, scale, offset float32) float32 {
	return offset + scale*float32(2*int(q)-1)
}

// DequantizeFP8 returns scale·e4m3(q).
func DequantizeFP8(q uint8, scale float32) float32 { return scale * fp.E4M3ToF32(q) }

// FP8Code returns the E4M3FN byte of w/scale (round to nearest even, saturating at ±448).
func FP8Code(w, scale float32) uint8 { return fp.F32ToE4M3(w / scale) }
