package gptq

import (
	"fmt"

	"github.com/qpack-dev/qpack/blas"
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

// NewHessian returns an empty Hessian for inputs of width k.
func NewHessian(k int) *Hessian { return &Hessian{K: k, H: make([]float64, k*k)} }

// Add accumulates a batch x[rows, k] (row-major, one token per row) as the reference does:
// H *= n/(n+rows); H += 2/(n+rows)·xᵀx, on all cores (blas.SyrkT64: products in float32,
// summed in float32 over at most 512 tokens, those sums accumulated in float64). A batch holding
// NaN or ±Inf is refused and H is unchanged.
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
	total := h.N + rows
	decay, gain := float64(h.N)/float64(total), 2/float64(total)
	blas.SyrkT64(k, rows, gain, x, k, decay, h.H, k)
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

// mirrorUpper copies the upper triangle of the k×k matrix h onto the lower one, in 32×32 tiles
// so that the column-wise writes stay in cache.
func mirrorUpper(h []float64, k int) {
	const tile = 32
	for i0 := 0; i0 < k; i0 += tile {
		for j0 := i0; j0 < k; j0 += tile {
			for i := i0; i < min(i0+tile, k); i++ {
				for j := max(j0, i+1); j < min(j0+tile, k); j++ {
					h[j*k+i] = h[i*k+j]
				}
			}
		}
	}
}
