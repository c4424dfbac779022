package model

import (
	"sync"

	"github.com/qpack-dev/qpack/blas"
)

// matMulT computes y[rows, n] = x[rows, k] · w[n, k]ᵀ (+ bias[n] when bias is non-nil), the
// product of a linear layer with PyTorch's [out, in] weights, on all cores (package blas).
func matMulT(y, x, w, bias []float32, rows, k, n int) {
	if len(x) < rows*k || len(w) < n*k || len(y) < rows*n || (bias != nil && len(bias) < n) {
		panic("model: matMulT: slice shorter than its dimensions")
	}
	blas.SgemmNT(rows, n, k, x, k, w, k, y, n)
	if bias != nil {
		for r := 0; r < rows; r++ {
			yr := y[r*n : (r+1)*n]
			for c, b := range bias[:n] {
				yr[c] += b
			}
		}
	}
}

// parallel runs fn on workers goroutines and waits for them.
func parallel(workers int, fn func()) {
	if workers <= 1 {
		fn()
		return
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(fn)
	}
	wg.Wait()
}

// dot is Σ a[i]·b[i] in float32 with four partial sums.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// MatMulT is y[rows, n] = x[rows, k] · w[n, k]ᵀ (+ bias), the engine's product of a linear
// layer, for the quantizers that measure output errors (awq).
func MatMulT(y, x, w, bias []float32, rows, k, n int) { matMulT(y, x, w, bias, rows, k, n) }
