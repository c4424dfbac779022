package blas

import "runtime"

// SyrkT64 sets the upper triangle (j ≥ i) of the n×n float64 matrix C to beta·C + alpha·XᵀX,
// where X is k×n (k samples of n features, row stride ldx), on all cores: the Gram matrix of
// GPTQ's Hessian. Products are float32 and summed in float32 over blocks of at most 512 samples;
// the blocks' sums are added in float64. With beta = 0, C's old
// values are never read. The lower triangle is not touched. It always runs the Go engine.
func SyrkT64(n, k int, alpha float64, x []float32, ldx int, beta float64, c []float64, ldc int) {
	checkMatrix("X", k, n, x, ldx)
	checkMatrix("C", n, n, c, ldc)
	if n == 0 {
		return
	}
	out := &upperFloat64Out{c: c, n: n, ldc: ldc, alpha: alpha, beta: beta}
	if k == 0 || alpha == 0 {
		out.scale()
		return
	}
	syrkGo(current().kernel, runtime.GOMAXPROCS(0), n, k, x, ldx, out)
}

// syrkGo is SyrkT64 with kern (n, k > 0, arguments checked).
func syrkGo(kern *kernel, workers, n, k int, x []float32, ldx int, out *upperFloat64Out) {
	if n*n*k/2 < serialWork {
		workers = 1
	}
	o := &operands{tA: Trans, tB: NoTrans, m: n, n: n, k: k, alpha: 1, a: x, lda: ldx, b: x, ldb: ldx}
	// Steps in blocks of 512 rather than 256: every block reads and writes C in float64, and a
	// Hessian batch is one sequence of 512 tokens (measured 5–20% faster).
	long := *kern
	long.kc = max(kern.kc, syrkSteps)
	drive(&long, o, out, workers, 4) // rows near the top have more of the triangle: more, smaller tasks
}

// syrkSteps is SyrkT64's block of steps: at most this many float32 products are summed in
// float32 before the float64 accumulation.
const syrkSteps = 512

// upperFloat64Out folds float32 tiles into the upper triangle of a float64 matrix.
type upperFloat64Out struct {
	c           []float64
	n, ldc      int
	alpha, beta float64
}

func (f *upperFloat64Out) skip(i0, i1, j0, j1 int) bool { return j1 <= i0 }

func (f *upperFloat64Out) tile(kern *kernel, kc int, a, b []float32, i0, j0, rows, cols int, first bool) {
	var buf [maxTile]float32
	tmp := buf[:kern.mr*kern.nr]
	kern.run(kc, a, b, tmp, kern.nr, false)
	for r := range rows {
		lo := max(0, i0+r-j0) // the first column on or above the diagonal
		if lo >= cols {
			break // later rows start further right
		}
		dst := f.c[(i0+r)*f.ldc+j0:][lo:cols]
		src := tmp[r*kern.nr:][lo:cols]
		beta := f.beta
		if !first {
			beta = 1
		} else if beta == 0 {
			clear(dst) // never read C's old values (NaN there must not spread)
			beta = 1
		}
		axpby(dst, src, f.alpha, beta)
	}
}

// axpby sets dst[j] = beta·dst[j] + alpha·src[j].
func axpby(dst []float64, src []float32, alpha, beta float64) {
	dst = dst[:len(src)]
	if hasAVX2 && len(src) > 0 {
		axpby64(&dst[0], &src[0], len(src), alpha, beta)
		return
	}
	for j, v := range src {
		dst[j] = beta*dst[j] + alpha*float64(v)
	}
}

// scale sets the upper triangle to beta·C (k = 0: no samples).
func (f *upperFloat64Out) scale() {
	for i := range f.n {
		row := f.c[i*f.ldc+i : i*f.ldc+f.n]
		for j := range row {
			if f.beta == 0 {
				row[j] = 0
			} else {
				row[j] *= f.beta
			}
		}
	}
}
