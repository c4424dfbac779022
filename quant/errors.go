package quant

import (
	"fmt"
	"math"
)

// RelativeError returns ‖w − wq‖_F / ‖w‖_F, summed in float64. It is 0 when both are zero and
// +Inf when only w is. w and wq must have the same length.
func RelativeError(w, wq []float32) float64 {
	checkSameLen(w, wq)
	var diff, norm float64
	for i, v := range w {
		d := float64(v) - float64(wq[i])
		diff += d * d
		norm += float64(v) * float64(v)
	}
	return ratio(diff, norm)
}

// MaxAbsError returns max |w − wq|.
func MaxAbsError(w, wq []float32) float64 {
	checkSameLen(w, wq)
	var m float64
	for i, v := range w {
		m = max(m, math.Abs(float64(v)-float64(wq[i])))
	}
	return m
}

// WeightedRelativeError is RelativeError with a weight per input channel, for W[n, k] row-major:
// sqrt(Σ imp_k (w − wq)²_nk / Σ imp_k w²_nk). With imp_k = mean x_k² over calibration inputs
// the numerator is the expected squared output error when input channels are uncorrelated.
func WeightedRelativeError(w, wq []float32, n, k int, importance []float32) float64 {
	checkSameLen(w, wq)
	if len(w) != n*k || len(importance) != k {
		panic(fmt.Sprintf("quant: WeightedRelativeError: %d weights and %d importances for %dx%d", len(w), len(importance), n, k))
	}
	var diff, norm float64
	for r := range n { // row by row: the same sums, in the same order, without a division per value
		row, rowQ := w[r*k:(r+1)*k], wq[r*k:(r+1)*k]
		for c, v := range row {
			imp := float64(importance[c])
			d := float64(v) - float64(rowQ[c])
			diff += imp * d * d
			norm += imp * float64(v) * float64(v)
		}
	}
	return ratio(diff, norm)
}

func ratio(diff, norm float64) float64 {
	if diff == 0 {
		return 0
	}
	return math.Sqrt(diff / norm) // +Inf when norm is 0
}

func checkSameLen(w, wq []float32) {
	if len(w) != len(wq) {
		panic(fmt.Sprintf("quant: error measure of %d weights against %d", len(w), len(wq)))
	}
}
