package blas

import (
	"fmt"
	"math"
	"runtime"
)

// SgemmNT computes C = A·Bᵀ through OpenBLAS's cblas_sgemm: A is m×k, B is n×k and C is m×n,
// all row-major with leading dimensions (row strides) lda, ldb and ldc. It returns false,
// leaving C untouched, when OpenBLAS is not available, so the caller computes the product
// itself. Dimensions and slices that do not fit each other are a programming error: it panics
// before anything reaches C.
func SgemmNT(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) bool {
	checkMatrix("A", m, k, a, lda)
	checkMatrix("B", n, k, b, ldb)
	checkMatrix("C", m, n, c, ldc)
	l, err := lib()
	if err != nil {
		return false
	}
	if m == 0 || n == 0 {
		return true
	}
	if k == 0 { // an empty sum: keep cblas's quick-return rules out of it
		for i := range m {
			clear(c[i*ldc : i*ldc+n])
		}
		return true
	}
	l.sgemm(rowMajor, noTrans, trans, int32(m), int32(n), int32(k), 1, &a[0], int32(lda),
		&b[0], int32(ldb), 0, &c[0], int32(ldc))
	// C holds only uintptrs during the call; the slices must outlive it.
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
	return true
}

// checkMatrix panics unless s holds a rows×cols row-major matrix with row stride ld, every
// value fitting cblas's 32-bit integers.
func checkMatrix(name string, rows, cols int, s []float32, ld int) {
	if rows < 0 || cols < 0 || rows > math.MaxInt32 || cols > math.MaxInt32 {
		panic(fmt.Sprintf("blas: SgemmNT: %s is %d×%d", name, rows, cols))
	}
	if ld < max(1, cols) || ld > math.MaxInt32 {
		panic(fmt.Sprintf("blas: SgemmNT: %s has %d columns but leading dimension %d", name, cols, ld))
	}
	if rows > 0 && cols > 0 {
		if need := (rows-1)*ld + cols; len(s) < need {
			panic(fmt.Sprintf("blas: SgemmNT: %s (%d×%d, ld %d) needs %d values, has %d",
				name, rows, cols, ld, need, len(s)))
		}
	}
}
