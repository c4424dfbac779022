package gptq

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/qpack-dev/qpack/fp"
)

// Hessian is the running GPTQ Hessian of one linear layer's inputs, H = 2/n Σ xᵀx over the
// n input rows (tokens) seen so far, in float64. The zero value is ready for use; its width is
// fixed by the first Add or Merge.
type Hessian struct {
	K int       // input features (width of each row of x)
	N int       // rows accumulated
	H []float64 // K×K, row-major, symmetric
}

// scratch holds the batches transposed by Add (K×rows float64), shared by every Hessian: a
// mixture of experts accumulates two per expert at once, and a scratch kept by each would hold
// as much memory again as the Hessians.
var scratch sync.Pool

// NewHessian returns an empty Hessian for inputs of width k.
func NewHessian(k int) *Hessian { return &Hessian{K: k, H: make([]float64, k*k)} }

// Add accumulates a batch x[rows, k] (row-major, one token per row) as the reference does:
// H *= n/(n+rows); H += 2/(n+rows)·xᵀx. Products and sums are float64; the triangle of xᵀx is
// split over GOMAXPROCS goroutines. A batch holding NaN or ±Inf is refused and H is unchanged.
func (h *Hessian) Add(x []float32, rows, k int) error {
	if err := h.checkWidth(k); err != nil {
		return err
	}
	if rows <= 0 || len(x) != rows*k {
		return fmt.Errorf("gptq: hessian: %d activations for a batch of %d rows of width %d", len(x), rows, k)
	}
	if i := fp.FirstNonFinite(x); i >= 0 {
		return fmt.Errorf("gptq: hessian: activation at row %d, column %d is %g", i/k, i%k, x[i])
	}
	buf, _ := scratch.Get().(*[]float64)
	if buf == nil {
		buf = new([]float64)
	}
	*buf = transpose(*buf, x, rows, k)
	total := h.N + rows
	decay, gain := float64(h.N)/float64(total), 2/float64(total)
	syrkUpper(h.H, *buf, k, rows, decay, gain)
	scratch.Put(buf)
	mirrorUpper(h.H, k)
	h.N = total
	return nil
}

// Merge adds the rows accumulated in o, as if o's batches had been added to h:
// H = (n_h·H_h + n_o·H_o)/(n_h + n_o).
func (h *Hessian) Merge(o *Hessian) error {
	if err := h.checkWidth(o.K); err != nil {
		return err
	}
	if len(o.H) != o.K*o.K {
		return fmt.Errorf("gptq: hessian merge: %d values for width %d", len(o.H), o.K)
	}
	total := h.N + o.N
	if total == 0 {
		return nil
	}
	a, b := float64(h.N)/float64(total), float64(o.N)/float64(total)
	for i, v := range o.H {
		h.H[i] = a*h.H[i] + b*v
	}
	h.N = total
	return nil
}

// checkWidth fixes the width of an empty Hessian or checks it against k.
func (h *Hessian) checkWidth(k int) error {
	if k <= 0 {
		return fmt.Errorf("gptq: hessian: width %d must be positive", k)
	}
	if h.K == 0 && h.H == nil {
		h.K, h.H = k, make([]float64, k*k)
	}
	if k != h.K || len(h.H) != k*k {
		return fmt.Errorf("gptq: hessian of width %d (%d values) given inputs of width %d", h.K, len(h.H), k)
	}
	return nil
}

// transpose writes x[rows, k] (float32) as xt[k, rows] (float64) into dst, grown when short.
func transpose(dst []float64, x []float32, rows, k int) []float64 {
	if cap(dst) < rows*k {
		dst = make([]float64, rows*k)
	}
	dst = dst[:rows*k]
	const tile = 64
	for r0 := 0; r0 < rows; r0 += tile {
		for c0 := 0; c0 < k; c0 += tile {
			for r := r0; r < min(r0+tile, rows); r++ {
				for c := c0; c < min(c0+tile, k); c++ {
					dst[c*rows+r] = float64(x[r*k+c])
				}
			}
		}
	}
	return dst
}

// syrkUpper sets, for i ≤ j, H[i,j] = decay·H[i,j] + gain·Σ_t xt[i,t]·xt[j,t]. Pairs of rows of
// the triangle are handed out to the workers one at a time (rows differ in length).
func syrkUpper(h, xt []float64, k, rows int, decay, gain float64) {
	pairs := (k + 1) / 2
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), pairs) {
		wg.Go(func() {
			for {
				p := int(next.Add(1)) - 1
				if p >= pairs {
					return
				}
				syrkRowPair(h, xt, k, rows, 2*p, decay, gain)
			}
		})
	}
	wg.Wait()
}

// syrkRowPair updates rows i and i+1 (when inside) of the upper triangle, four columns at a
// time with eight accumulators so that each loaded x is used four times.
func syrkRowPair(h, xt []float64, k, rows, i int, decay, gain float64) {
	i1 := min(i+1, k-1) // the last row of an odd k pairs with itself
	a0, a1 := xt[i*rows:(i+1)*rows], xt[i1*rows:(i1+1)*rows]
	j := i
	for ; j+4 <= k; j += 4 {
		b0, b1 := xt[j*rows:(j+1)*rows], xt[(j+1)*rows:(j+2)*rows]
		b2, b3 := xt[(j+2)*rows:(j+3)*rows], xt[(j+3)*rows:(j+4)*rows]
		var s00, s01, s02, s03, s10, s11, s12, s13 float64
		for t, x0 := range a0 {
			x1, y0, y1, y2, y3 := a1[t], b0[t], b1[t], b2[t], b3[t]
			s00 += x0 * y0
			s01 += x0 * y1
			s02 += x0 * y2
			s03 += x0 * y3
			s10 += x1 * y0
			s11 += x1 * y1
			s12 += x1 * y2
			s13 += x1 * y3
		}
		row0, row1 := h[i*k+j:i*k+j+4], h[i1*k+j:i1*k+j+4]
		for c, s := range [4]float64{s00, s01, s02, s03} {
			row0[c] = decay*row0[c] + gain*s
		}
		if i1 != i {
			for c, s := range [4]float64{s10, s11, s12, s13} {
				if j+c >= i1 { // row i+1 starts one column later
					row1[c] = decay*row1[c] + gain*s
				}
			}
		}
	}
	for ; j < k; j++ {
		b := xt[j*rows : (j+1)*rows]
		var s0, s1 float64
		for t, x0 := range a0 {
			s0 += x0 * b[t]
			s1 += a1[t] * b[t]
		}
		h[i*k+j] = decay*h[i*k+j] + gain*s0
		if i1 != i && j >= i1 {
			h[i1*k+j] = decay*h[i1*k+j] + gain*s1
		}
	}
}

// mirrorUpper copies the upper triangle of the k×k matrix h onto the lower one.
func mirrorUpper(h []float64, k int) {
	for i := range k {
		for j := i + 1; j < k; j++ {
			h[j*k+i] = h[i*k+j]
		}
	}
}
