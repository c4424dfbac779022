package fp

import "math"

// e2m1Ties are the magnitudes halfway between neighbouring E2M1 values 0, 0.5, 1, 1.5, 2, 3, 4,
// 6, with whether a value exactly there rounds up: to the neighbour whose code is even (ties to
// even), which is the upper one at 0.75, 1.75 and 3.5.
var e2m1Ties = [7]struct {
	at float32
	up bool
}{{0.25, false}, {0.75, true}, {1.25, false}, {1.75, true}, {2.5, false}, {3.5, true}, {5, false}}

// F32ToE2M1 encodes f as a 4-bit E2M1 value (OCP FP4: sign bit 3, two exponent bits with bias
// 1, one mantissa bit; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), rounding to nearest with ties
// to even and saturating at ±6. A value that rounds to zero gives +0 (code 0) whatever its
// sign, so that every decoder agrees on its bits (ggml reads code 8 as +0, others as −0). NaN
// gives code 0. The code is in the low nibble.
func F32ToE2M1(f float32) uint8 {
	a := float32(math.Abs(float64(f)))
	var mag uint8
	for _, t := range e2m1Ties {
		if a > t.at || (t.up && a == t.at) {
			mag++
		}
	}
	if mag == 0 {
		return 0
	}
	return uint8(math.Float32bits(f)>>31)<<3 | mag
}
