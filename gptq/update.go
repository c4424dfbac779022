package gptq

import "github.com/qpack-dev/qpack/blas"

// trailingUpdate pushes one block's errors to the columns after it, for rows [lo, hi):
// W[r, i2:] −= E[r, :] · U[i1:i2, i2:], with E[r, b] = errs[(r−lo)·bs + b]. It is one product
// on the calling goroutine (each worker owns its rows). Sums are float32, like the reference's
// matmul.
func trailingUpdate(w []float32, k, lo, hi int, errs []float32, bs int, u []float32, i1, i2 int) {
	if i2 >= k || hi <= lo {
		return
	}
	blas.SgemmSerial(blas.NoTrans, blas.NoTrans, hi-lo, k-i2, i2-i1, -1, errs, bs, u[i1*k+i2:], k, 1, w[lo*k+i2:], k)
}
