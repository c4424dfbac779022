package vec

import "math"

// expLimit bounds the exponent: exp(±88.376) is the largest/smallest power the fast kernel
// forms without overflow (2^±127.5).
const expLimit = 88.3762626647949

// Exp sets dst[i] = e^src[i] for i < len(src) (dst may be src). Arguments are clamped to
// [−88.376, 88.376] first, so the result is at most about 2.4e38 and underflows to 0; NaN stays
// NaN. On AVX2+FMA CPUs the error is within 2 ulp of the float32 rounding of e^x.
func Exp(dst, src []float32) { ExpSum(dst, src, 0) }

// ExpSum sets dst[i] = e^(src[i] − shift) as Exp does (dst may be src) and returns Σ dst[i],
// summed in float64: the exponentials of a softmax and their normaliser in one pass.
func ExpSum(dst, src []float32, shift float32) float64 {
	dst = dst[:len(src)]
	n, sum := 0, 0.0
	if hasAVX2 {
		if n = len(src) &^ 7; n > 0 {
			sum = expSumAVX2(&dst[0], &src[0], n, shift)
		}
	}
	return sum + expSumGo(dst[n:], src[n:], shift)
}

// expSumGo is ExpSum in plain Go: float64 exp rounded to float32, after the same clamping.
func expSumGo(dst, src []float32, shift float32) float64 {
	dst = dst[:len(src)]
	sum := 0.0
	for i, x := range src {
		x -= shift
		if x == x { // NaN passes through
			x = min(max(x, -expLimit), expLimit)
		}
		dst[i] = float32(math.Exp(float64(x)))
		sum += float64(dst[i])
	}
	return sum
}

// Max returns the largest value of x (−Inf for an empty x). With NaN in x the result is
// unspecified.
func Max(x []float32) float32 {
	m, n := float32(math.Inf(-1)), 0
	if hasAVX2 {
		if n = len(x) &^ 7; n > 0 {
			m = maxAVX2(&x[0], n)
		}
	}
	for _, v := range x[n:] {
		m = max(m, v)
	}
	return m
}

// Scale multiplies every value of x by a.
func Scale(x []float32, a float32) {
	n := 0
	if hasAVX2 {
		if n = len(x) &^ 7; n > 0 {
			scaleAVX2(&x[0], n, a)
		}
	}
	for i := n; i < len(x); i++ {
		x[i] *= a
	}
}
