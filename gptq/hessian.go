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
	K int // input features (width of each row of x)
	N int // rows accumulated

	h []float64 // K×K, row-major; below the diagonal only once mirrored
	// stale: Add updated the upper triangle only. A mixture of experts adds one small batch
	// per expert and sequence, and mirroring K² values after each would cost as much as the
	// rank-k update itself (docs/moe.md), so Matrix mirrors once, when H is read.
	stale bool
}

// NewHessian returns an empty Hessian for inputs of width k.
func NewHessian(k int) *Hessian { return &Hessian{K: k, h: make([]float64, k*k)} }

// Matrix returns H, K×K, row-major and symmetric (nil before any input). It is the Hessian's
// own storage, not a copy: a later Add or Merge changes it.
func (h *Hessian) Matrix() []float64 {
	if h.stale {
		mirrorUpper(h.h, h.K)
		h.stale = false
	}
	return h.h
}

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
	blas.SyrkT64(k, rows, gain, x, k, decay, h.h, k)
	h.stale = true
	h.N = total
	return nil
}

// Merge adds the rows accumulated in o, as if o's batches had been added to h:
// H = (n_h·H_h + n_o·H_o)/(n_h + n_o).
func (h *Hessian) Merge(o *Hessian) error {
	if err := h.checkWidth(o.K); err != nil {
		return err
	}
	if len(o.h) != o.K*o.K {
		return fmt.Errorf("gptq: hessian merge: %d values for width %d", len(o.h), o.K)
	}
	total := h.N + o.N
	if total == 0 {
		return nil
	}
	a, b := float64(h.N)/float64(total), float64(o.N)/float64(total)
	for i, v := range o.h { // the upper triangles are current; the lower ones once mirrored
		h.h[i] = a*h.h[i] + b*v
	}
	h.stale = h.stale || o.stale
	h.N = total
	return nil
}

// checkWidth fixes the width of an empty Hessian or checks it against k.
func (h *Hessian) checkWidth(k int) error {
	if k <= 0 {
		return fmt.Errorf("gptq: hessian: width %d must be positive", k)
	}
	if h.K == 0 && h.h == nil {
		h.K, h.h = k, make([]float64, k*k)
	}
	if k != h.K || len(h.h) != k*k {
		return fmt.Errorf("gptq: hessian of width %d (%d values) given inputs of width %d", h.K, len(h.h), k)
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
