package gptq

import "github.com/qpack-dev/qpack/blas"

// trailingUpdate pushes one block's differences from the original weights to the columns after
// it, for rows [lo, hi): W[r, i2:] += D[r, :] · T′[i1:i2, i2:], with D[r, b] = diffs[(r−lo)·bs + b].
// It is one product on the calling goroutine (each worker owns its rows). Sums are float32,
// like the reference's matmul.
func trailingUpdate(w []float32, k, lo, hi int, diffs []float32, bs int, t []float32, i1, i2 int) {
	if i2 >= k || hi <= lo {
		return
	}
	blas.SgemmSerial(blas.NoTrans, blas.NoTrans, hi-lo, k-i2, i2-i1, 1, diffs, bs, t[i1*k+i2:], k, 1, w[lo*k+i2:], k)
}
