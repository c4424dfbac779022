package quant

import (
	"fmt"
	"slices"
	"sync"
)

// ConcatRows joins tensors that hold consecutive rows of one weight, quantized with the same
// scheme and column order (a GPTQ solve split by rows across GPUs): the result's rows are
// parts[0]'s, then parts[1]'s, and so on. Grids whose parameters are not simply per row — the
// k-quants, IQ types and NVFP4's tensor-wide global scale — are refused.
func ConcatRows(parts []*Tensor) (*Tensor, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("quant: no rows to join")
	}
	first := parts[0]
	switch first.Scheme.Grid {
	case KQuant, IQuant, NVFP4:
		return nil, fmt.Errorf("quant: %s tensors cannot be joined by rows", first.Scheme)
	}
	for i, p := range parts {
		if p.Scheme != first.Scheme || p.K != first.K || !slices.Equal(p.GIdx, first.GIdx) {
			return nil, fmt.Errorf("quant: rows %d of %d: %s with %d columns and its column order do not match the first part's %s with %d columns",
				i, len(parts), p.Scheme, p.K, first.Scheme, first.K)
		}
	}
	// Each slice is made at its final size and filled by a copy per part at once (a 7B MLP
	// weight has 45 M codes: growing by append copied them several times over, on one core).
	return &Tensor{Scheme: first.Scheme, K: first.K, GIdx: first.GIdx, N: total(parts, func(p *Tensor) int { return p.N }),
		Codes:   joined(parts, func(p *Tensor) []uint8 { return p.Codes }),
		Scales:  joined(parts, func(p *Tensor) []float32 { return p.Scales }),
		Zeros:   joined(parts, func(p *Tensor) []uint8 { return p.Zeros }),
		Offsets: joined(parts, func(p *Tensor) []float32 { return p.Offsets }),
	}, nil
}

// joined concatenates one field of the parts into a slice of its final size, the parts copied
// at once; nil if all are empty.
func joined[T any](parts []*Tensor, field func(*Tensor) []T) []T {
	n := total(parts, func(p *Tensor) int { return len(field(p)) })
	if n == 0 {
		return nil
	}
	out := make([]T, n)
	var wg sync.WaitGroup
	at := 0
	for _, p := range parts {
		src := field(p)
		dst := out[at : at+len(src)]
		wg.Go(func() { copy(dst, src) })
		at += len(src)
	}
	wg.Wait()
	return out
}

func total(parts []*Tensor, size func(*Tensor) int) int {
	n := 0
	for _, p := range parts {
		n += size(p)
	}
	return n
}
