package blas

import (
	"fmt"
	"math"
	"runtime"
)

// Transpose says whether a matrix operand is used as stored or transposed.
type Transpose bool

const (
	NoTrans Transpose = false
	Trans   Transpose = true
)

// Sgemm computes C = alpha·op(A)·op(B) + beta·C on all cores (GOMAXPROCS goroutines), where
// op(A) is m×k and op(B) is k×n: op(X) is X as stored (NoTrans) or its transpose (Trans). All
// matrices are row-major with row strides lda, ldb and ldc. With beta = 0, C's old contents are
// never read (NaN there does not spread). Dimensions and slices that do not fit each other are a
// programming error: it panics before anything reaches C.
func Sgemm(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemm(runtime.GOMAXPROCS(0), true, tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// SgemmSerial is Sgemm on the calling goroutine alone, for callers that already run one
// product per core. It always uses the Go engine (OpenBLAS threads itself).
func SgemmSerial(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	sgemm(1, false, tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// SgemmNT computes C = A·Bᵀ on all cores, the product of a linear layer: A is m×k (inputs),
// B is n×k (weights as PyTorch stores them, out × in) and C is m×n.
func SgemmNT(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	Sgemm(NoTrans, Trans, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)
}

// serialWork is the size m·n·k below which a product runs on one goroutine: starting workers
// costs about as much as the product.
const serialWork = 1 << 17

// sgemm runs Sgemm on up to workers goroutines; library allows OpenBLAS when it is the chosen path.
func sgemm(workers int, library bool, tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	checkOperand("A", tA, m, k, a, lda)
	checkOperand("B", tB, k, n, b, ldb)
	checkMatrix("C", m, n, c, ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scaleMatrix(c, m, n, ldc, beta)
		return
	}
	p := current()
	if p.UseOpenBLAS && library {
		p.lib.gemm(tA, tB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
		return
	}
	gemmGo(p.kernel, workers, &operands{tA: tA, tB: tB, m: m, n: n, k: k, alpha: alpha, a: a, lda: lda, b: b, ldb: ldb}, beta, c, ldc)
}

// gemmGo is Sgemm's Go engine with kern (m, n, k > 0, arguments checked).
func gemmGo(kern *kernel, workers int, o *operands, beta float32, c []float32, ldc int) {
	if beta != 0 && beta != 1 {
		scaleMatrix(c, o.m, o.n, ldc, beta)
	}
	if o.m*o.n*o.k < serialWork {
		workers = 1
	}
	drive(kern, o, &float32Out{c: c, ldc: ldc, add: beta != 0}, workers, 1)
}

// float32Out writes tiles to C, or adds them to it.
type float32Out struct {
	c   []float32
	ldc int
	add bool // add even the first steps' tile (beta ≠ 0: C was scaled beforehand)
}

func (f *float32Out) skip(i0, i1, j0, j1 int) bool { return false }

func (f *float32Out) tile(kern *kernel, kc int, a, b []float32, i0, j0, rows, cols int, first bool) {
	add := f.add || !first
	if rows == kern.mr && cols == kern.nr {
		kern.run(kc, a, b, f.c[i0*f.ldc+j0:], f.ldc, add)
		return
	}
	var buf [maxTile]float32
	tmp := buf[:kern.mr*kern.nr]
	kern.run(kc, a, b, tmp, kern.nr, false)
	for r := range rows {
		dst, src := f.c[(i0+r)*f.ldc+j0:][:cols], tmp[r*kern.nr:][:cols]
		if add {
			for j, v := range src {
				dst[j] += v
			}
		} else {
			copy(dst, src)
		}
	}
}

// scaleMatrix sets the m×n matrix c to beta·c; beta = 0 clears it (NaN included).
func scaleMatrix(c []float32, m, n, ldc int, beta float32) {
	if beta == 1 {
		return
	}
	for i := range m {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// checkOperand panics unless s holds op(X), a rows×cols matrix, with row stride ld as stored.
func checkOperand(name string, t Transpose, rows, cols int, s []float32, ld int) {
	if t == Trans {
		rows, cols = cols, rows
	}
	checkMatrix(name, rows, cols, s, ld)
}

// checkMatrix panics unless s holds a rows×cols row-major matrix with row stride ld, every
// value fitting cblas's 32-bit integers.
func checkMatrix[T float32 | float64](name string, rows, cols int, s []T, ld int) {
	if rows < 0 || cols < 0 || rows > math.MaxInt32 || cols > math.MaxInt32 {
		panic(fmt.Sprintf("blas: %s is %d×%d", name, rows, cols))
	}
	if ld < max(1, cols) || ld > math.MaxInt32 {
		panic(fmt.Sprintf("blas: %s has %d columns but leading dimension %d", name, cols, ld))
	}
	if rows > 0 && cols > 0 {
		if need := (rows-1)*ld + cols; len(s) < need {
			panic(fmt.Sprintf("blas: %s (%d×%d, ld %d) needs %d values, has %d", name, rows, cols, ld, need, len(s)))
		}
	}
}
