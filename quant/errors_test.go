package quant

import (
	"math"
	"testing"
)

func TestErrorMeasures(t *testing.T) {
	w := []float32{3, 0, 0, 4}    // ‖w‖ = 5
	wq := []float32{3, 1, 0, 4.5} // ‖w − wq‖ = sqrt(1.25)
	if got, want := RelativeError(w, wq), math.Sqrt(1.25)/5; math.Abs(got-want) > 1e-15 {
		t.Errorf("RelativeError = %v, want %v", got, want)
	}
	if got := MaxAbsError(w, wq); got != 1 {
		t.Errorf("MaxAbsError = %v, want 1", got)
	}
	// Uniform importance reproduces the plain relative error.
	if got, want := WeightedRelativeError(w, wq, 2, 2, []float32{2, 2}), RelativeError(w, wq); math.Abs(got-want) > 1e-15 {
		t.Errorf("uniform WeightedRelativeError = %v, want %v", got, want)
	}
	// Importance [1, 0] keeps column 0 only, where the rows are (3, 0) vs (3, 0): no error.
	if got := WeightedRelativeError(w, wq, 2, 2, []float32{1, 0}); got != 0 {
		t.Errorf("column-0 WeightedRelativeError = %v, want 0", got)
	}
	// Importance [0, 1]: column 1 is (0, 4) vs (1, 4.5): sqrt(1.25)/4.
	if got, want := WeightedRelativeError(w, wq, 2, 2, []float32{0, 1}), math.Sqrt(1.25)/4; math.Abs(got-want) > 1e-15 {
		t.Errorf("column-1 WeightedRelativeError = %v, want %v", got, want)
	}
	zero := []float32{0, 0}
	if got := RelativeError(zero, zero); got != 0 {
		t.Errorf("RelativeError(0, 0) = %v, want 0", got)
	}
	if got := RelativeError(zero, []float32{0, 1}); !math.IsInf(got, 1) {
		t.Errorf("RelativeError(0, x) = %v, want +Inf", got)
	}
}

// BenchmarkWeightedRelativeError measures a 7B MLP weight's error (11008 × 4096), as the plan's
// output probe does for each replaced linear.
func BenchmarkWeightedRelativeError(b *testing.B) {
	const n, k = 11008, 4096
	w, wq, imp := make([]float32, n*k), make([]float32, n*k), make([]float32, k)
	for i := range w {
		w[i], wq[i] = float32(i%97)-48, float32(i%89)-44
	}
	for c := range imp {
		imp[c] = float32(c%13) + 1
	}
	b.SetBytes(int64(8 * n * k))
	for b.Loop() {
		WeightedRelativeError(w, wq, n, k, imp)
	}
}
