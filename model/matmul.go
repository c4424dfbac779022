package model

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/qpack-dev/qpack/blas"
)

// Tile sizes of matMulTGo's work items: a worker takes tileRows rows of x against tileCols
// rows of w, so both stay in cache while it runs the register-blocked kernel over them.
const (
	tileRows = 64
	tileCols = 64
)

// blasMinWork is the smallest rows·k·n handed to OpenBLAS: below it the call and thread
// start-up cost about as much as the pure-Go product.
const blasMinWork = 1 << 16

// matMulT computes y[rows, n] = x[rows, k] · w[n, k]ᵀ (+ bias[n] when bias is non-nil),
// the product of a linear layer with PyTorch's [out, in] weights: through OpenBLAS when it is
// present (QPACK_BLAS=go turns it off, see package blas) and the product is large enough to pay
// for the call, otherwise with matMulTGo.
func matMulT(y, x, w, bias []float32, rows, k, n int) {
	if len(x) < rows*k || len(w) < n*k || len(y) < rows*n || (bias != nil && len(bias) < n) {
		panic("model: matMulT: slice shorter than its dimensions")
	}
	if rows*k*n < blasMinWork || !blas.SgemmNT(rows, n, k, x, k, w, k, y, n) {
		matMulTGo(y, x, w, rows, k, n)
	}
	if bias != nil {
		for r := 0; r < rows; r++ {
			yr := y[r*n : (r+1)*n]
			for c, b := range bias[:n] {
				yr[c] += b
			}
		}
	}
}

// matMulTGo computes y[rows, n] = x[rows, k] · w[n, k]ᵀ in pure Go on all cores: the reference
// for the OpenBLAS path and the fallback when it is absent.
func matMulTGo(y, x, w []float32, rows, k, n int) {
	rowTiles, colTiles := (rows+tileRows-1)/tileRows, (n+tileCols-1)/tileCols
	jobs := rowTiles * colTiles
	var next atomic.Int64
	work := func() {
		for {
			j := int(next.Add(1) - 1)
			if j >= jobs {
				return
			}
			r0, c0 := (j/colTiles)*tileRows, (j%colTiles)*tileCols
			matMulTile(y, x, w, k, n, r0, min(r0+tileRows, rows), c0, min(c0+tileCols, n))
		}
	}
	parallel(min(jobs, runtime.GOMAXPROCS(0)), work)
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

// matMulTile fills y[r0:r1, c0:c1]: two rows of x against four rows of w at a time, eight
// accumulators that stay in registers.
func matMulTile(y, x, w []float32, k, n, r0, r1, c0, c1 int) {
	r := r0
	for ; r+2 <= r1; r += 2 {
		x0 := x[r*k : (r+1)*k]
		x1 := x[(r+1)*k : (r+2)*k][:len(x0)] // equal lengths let the compiler drop bounds checks
		c := c0
		for ; c+4 <= c1; c += 4 {
			w0 := w[c*k : (c+1)*k][:len(x0)]
			w1 := w[(c+1)*k : (c+2)*k][:len(x0)]
			w2 := w[(c+2)*k : (c+3)*k][:len(x0)]
			w3 := w[(c+3)*k : (c+4)*k][:len(x0)]
			var s00, s01, s02, s03, s10, s11, s12, s13 float32
			for i := range x0 {
				a, b := x0[i], x1[i]
				v0, v1, v2, v3 := w0[i], w1[i], w2[i], w3[i]
				s00 += a * v0
				s01 += a * v1
				s02 += a * v2
				s03 += a * v3
				s10 += b * v0
				s11 += b * v1
				s12 += b * v2
				s13 += b * v3
			}
			y[r*n+c], y[r*n+c+1], y[r*n+c+2], y[r*n+c+3] = s00, s01, s02, s03
			y[(r+1)*n+c], y[(r+1)*n+c+1], y[(r+1)*n+c+2], y[(r+1)*n+c+3] = s10, s11, s12, s13
		}
		for ; c < c1; c++ {
			y[r*n+c] = dot(x0, w[c*k:(c+1)*k])
			y[(r+1)*n+c] = dot(x1, w[c*k:(c+1)*k])
		}
	}
	for ; r < r1; r++ {
		xr := x[r*k : (r+1)*k]
		for c := c0; c < c1; c++ {
			y[r*n+c] = dot(xr, w[c*k:(c+1)*k])
		}
	}
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
