package gptq

import (
	"github.com/qpack-dev/qpack/blas"
	"github.com/qpack-dev/qpack/quant"
)

// squaredError returns ‖W − Q‖²_F in float64, with dead columns of W counted as zero.
func squaredError(t *quant.Tensor, w []float32, dead []bool) float64 {
	q := t.Dequantize(nil)
	sum := 0.0
	for i, v := range w {
		if dead[i%t.K] {
			v = 0
		}
		d := float64(v) - float64(q[i])
		sum += d * d
	}
	return sum
}

// baselineLoss returns tr(W H Wᵀ) = Σ_r w_r H w_rᵀ (dead columns of W as zero) for
// Stats.RelativeLoss: W·H as one float32 product on all cores (package blas), each row dotted
// with w_r in float64. It agrees with the float64 quadraticForm of the tests to about 1e-6.
func baselineLoss(w []float32, n, k int, h []float64, dead []bool) float64 {
	h32 := make([]float32, k*k)
	for i, v := range h {
		h32[i] = float32(v)
	}
	wz := make([]float32, n*k)
	for i, v := range w[:n*k] {
		if !dead[i%k] {
			wz[i] = v
		}
	}
	wh := make([]float32, n*k)
	blas.Sgemm(blas.NoTrans, blas.NoTrans, n, k, k, 1, wz, k, h32, k, 0, wh, k)
	sum := 0.0
	for i, v := range wh {
		sum += float64(v) * float64(wz[i])
	}
	return sum
}
