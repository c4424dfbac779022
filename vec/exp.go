package vec

import "math"

// expLimit bounds Exp's argument: exp(±88.376) is the largest/smallest power the fast kernel
// forms without overflow (2^±127.5).
const expLimit = 88.3762626647949

// Exp sets dst[i] = e^src[i] for i < len(src) (dst may be src). Arguments are clamped to
// [−88.376, 88.376] first, so the result is at most about 2.4e38 and underflows to 0; NaN stays
// NaN. On AVX2+FMA CPUs the error is within 2 ulp of the float32 rounding of e^x.
func Exp(dst, src []float32) {
	dst = dst[:len(src)]
	n := 0
	if hasAVX2 {
		n = len(src) &^ 7
		if n > 0 {
			expAVX2(&dst[0], &src[0], n)
		}
	}
	expGo(dst[n:], src[n:])
}

// expGo is Exp in plain Go: float64 exp rounded to float32, after the same clamping.
func expGo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		if x == x { // NaN passes through
			x = min(max(x, -expLimit), expLimit)
		}
		dst[i] = float32(math.Exp(float64(x)))
	}
}
