// Package iquant holds llama.cpp's IQ formats (iq1_s … iq4_xs): ggml's search for a block's
// grid points, signs and scales from its weights and optional importance, and ggml's block bytes.
//
// Fitting reproduces ggml-quants.c (llama.cpp c392e509) bit for bit: Fit on one block is what
// ggml_quantize_chunk writes for it, with or without an importance matrix (importance = E[x²] of
// each input channel), refusals included: where ggml refuses a type without an importance matrix
// or aborts on the data, Fit returns an error. The parameters are what quant.Tensor stores for
// the grid quant.IQuant, and AppendRows writes them as ggml's blocks, byte for byte:
//
//	typ, err := iquant.TypeOf(scheme)
//	q, err := iquant.Quantize(w, n, k, scheme, imp) // RTN, rows over the cores
//	blocks, err := iquant.AppendRows(nil, q)        // ggml's bytes for a GGUF tensor
//	q, err = iquant.Decode(scheme, blocks, n, k)     // and back
//
// A method that changes the weights as it goes (GPTQ's error feedback) fits each block once,
// from its weights at that moment, then codes each grid group (or weight, for iq4) with the
// block's fixed scales when it reaches the group's first column (Type.CodeGroup).
package iquant

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// MaxBlock is the most weights a block holds.
const MaxBlock = quant.SuperBlock

// Params are one block's parameters, with the meaning and ranges of quant.Tensor's IQ fields.
type Params struct {
	D      float32              // F16 value
	Scales [MaxBlock / 16]int8  // per sub-block
	Points [MaxBlock / 4]uint16 // per grid point (Dim weights)
	Signs  [MaxBlock / 8]uint8  // per SignGroup weights
	Codes  [MaxBlock]uint8      // iq4: per weight
}

// Type is one IQ scheme with its fitting.
type Type struct {
	quant.IQFormat
	Scheme quant.Scheme
	lat    func() *lattice // the grid's search tables, built on first use (nil for iq4)
	fit    func(t *Type, c *carry, x, imp []float32, p *Params) error
}

// carry is what ggml's quantizers keep from one block of a row to the next in arrays they
// never reset, and read back when a sub-block has no weighted values (all importance zero):
// the levels of the last sub-block (iq2_xs, iq2_s, iq3_xxs), which of its groups were found on
// the grid (iq3_xxs) and the δ signs of the last block's sub-blocks (iq1_s, iq1_m). ggml starts
// each row with whatever the stack holds; a row starts here with zeros.
type carry struct {
	L      [32]int8
	onGrid [8]bool
	shifts [16]int8
}

var types = map[quant.IQType]*Type{
	quant.IQ4NL:  {fit: fitIQ4},
	quant.IQ4XS:  {fit: fitIQ4},
	quant.IQ3XXS: {fit: fitLattice},
	quant.IQ3S:   {fit: fitLattice},
	quant.IQ2XXS: {fit: fitLattice},
	quant.IQ2XS:  {fit: fitLattice},
	quant.IQ2S:   {fit: fitLattice},
	quant.IQ1S:   {fit: fitIQ1},
	quant.IQ1M:   {fit: fitIQ1},
}

func init() {
	for it, t := range types {
		t.Scheme, _ = quant.IQuantScheme(it)
		t.IQFormat, _ = t.Scheme.IQuant()
		t.lat = lattices[it]
	}
}

// TypeOf returns the IQ type of scheme s.
func TypeOf(s quant.Scheme) (*Type, error) {
	if _, ok := s.IQuant(); !ok || s.Validate() != nil {
		return nil, fmt.Errorf("iquant: %s is not an IQ scheme (iq1_s … iq4_xs)", s)
	}
	t, ok := types[s.IQ]
	if !ok {
		return nil, fmt.Errorf("iquant: no quantizer for %s", s)
	}
	return t, nil
}

// Fit fits one block: w holds its Block weights and imp their importance (nil for none; finite
// and ≥ 0). Without importance it is what ggml_quantize_chunk does with no imatrix, with it the
// imatrix variant. Errors name the offending index within the block.
func (t *Type) Fit(w, imp []float32) (Params, error) { return t.fitCarrying(&carry{}, w, imp) }

// fitCarrying is Fit as the block after those that left c.
func (t *Type) fitCarrying(c *carry, w, imp []float32) (Params, error) {
	var p Params
	if err := t.checkBlock(w, imp); err != nil {
		return p, err
	}
	if err := t.fit(t, c, w, imp, &p); err != nil {
		return Params{}, err
	}
	if !finite(p.D) {
		return Params{}, fmt.Errorf("block scale d = %g is not finite in F16 (weights too large)", p.D)
	}
	return p, nil
}

func (t *Type) checkBlock(w, imp []float32) error {
	if len(w) != t.Block || (imp != nil && len(imp) != len(w)) {
		return fmt.Errorf("iquant: a %s block holds %d weights, not %d (with %d importances)", t.Scheme, t.Block, len(w), len(imp))
	}
	if imp == nil && t.Imatrix {
		return fmt.Errorf("iquant: %s needs an importance matrix: ggml refuses to quantize it without one (use --imatrix)", t.Scheme)
	}
	for i, v := range w {
		if !finite(v) {
			return fmt.Errorf("weight %d is %g", i, v)
		}
	}
	for i, v := range imp {
		if !(v >= 0) || math.IsInf(float64(v), 1) {
			return fmt.Errorf("importance %d is %g; want finite and ≥ 0", i, v)
		}
	}
	return nil
}

// ggmlAborts is the error for data on which ggml's quantizer aborts (a failed GGML_ASSERT).
func ggmlAborts(format string, args ...any) error {
	return fmt.Errorf("ggml's quantizer aborts on these weights: "+format, args...)
}

func finite(v float32) bool { return !math.IsInf(float64(v), 0) && v == v }

// Get returns the parameters of block b of row n of the IQ tensor q.
func (t *Type) Get(q *quant.Tensor, n, b int) Params {
	var p Params
	t.transfer(q, n, b, &p, false)
	return p
}

// Put stores p as the parameters of block b of row n of the IQ tensor q.
func (t *Type) Put(q *quant.Tensor, n, b int, p *Params) { t.transfer(q, n, b, p, true) }

// transfer copies block b of row n between q and p, into q when put.
func (t *Type) transfer(q *quant.Tensor, n, b int, p *Params, put bool) {
	lo := n*q.K + b*t.Block // flat index of the block's first weight
	if put {
		q.Scales[lo/t.Block] = p.D
	} else {
		p.D = q.Scales[lo/t.Block]
	}
	if q.SubScales != nil {
		move(q.SubScales[lo/t.Sub:(lo+t.Block)/t.Sub], p.Scales[:], put)
	}
	if t.Dim == 0 {
		move(q.Codes[lo:lo+t.Block], p.Codes[:], put)
		return
	}
	move(q.Points[lo/t.Dim:(lo+t.Block)/t.Dim], p.Points[:], put)
	move(q.Signs[lo/t.SignGroup:(lo+t.Block)/t.SignGroup], p.Signs[:], put)
}

// move copies between a tensor's slice and a Params array: into the tensor when put.
func move[T any](tensor, params []T, put bool) {
	if put {
		copy(tensor, params)
	} else {
		copy(params, tensor)
	}
}

// QuantizeRow fits every block of row n of the IQ tensor q (every slice allocated, e.g. by
// quant.NewIQuantTensor) from the row's K weights w and importance imp (nil, or K values).
// Errors name the columns.
func (t *Type) QuantizeRow(q *quant.Tensor, n int, w, imp []float32) error {
	if len(w) != q.K || (imp != nil && len(imp) != q.K) {
		return fmt.Errorf("iquant: %d weights and %d importances for a row of %d", len(w), len(imp), q.K)
	}
	if err := t.Scheme.CheckRowLength(q.K); err != nil {
		return fmt.Errorf("iquant: %w", err)
	}
	if i := fp.FirstNonFinite(w); i >= 0 {
		return fmt.Errorf("weight at column %d is %g", i, w[i])
	}
	var c carry
	for b := range q.K / t.Block {
		lo, hi := b*t.Block, (b+1)*t.Block
		var bimp []float32
		if imp != nil {
			bimp = imp[lo:hi]
		}
		p, err := t.fitCarrying(&c, w[lo:hi], bimp)
		if err != nil {
			return fmt.Errorf("columns %d…%d: %w", lo, hi-1, err)
		}
		t.Put(q, n, b, &p)
	}
	return nil
}

// Quantize fits every block of W[n, k] (float32, row-major) in IQ scheme s with per-input-channel
// importance imp (len k; nil for none), rows spread over GOMAXPROCS goroutines: round-to-nearest
// as ggml_quantize_chunk does it. On error the lowest failing row is named.
func Quantize(w []float32, n, k int, s quant.Scheme, imp []float32) (*quant.Tensor, error) {
	t, err := checkTensor(w, n, k, s, imp)
	if err != nil {
		return nil, err
	}
	q := quant.NewIQuantTensor(s, n, k)
	errs := make([]error, n)
	workers := min(runtime.GOMAXPROCS(0), n)
	var wg sync.WaitGroup
	for wk := range workers {
		wg.Go(func() {
			for r := wk; r < n; r += workers {
				errs[r] = t.QuantizeRow(q, r, w[r*k:(r+1)*k], imp)
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("row %d, %w", r, err)
		}
	}
	return q, nil
}

// checkTensor returns the type of a whole n×k tensor of scheme s after checking the shapes and
// the row length.
func checkTensor(w []float32, n, k int, s quant.Scheme, imp []float32) (*Type, error) {
	t, err := TypeOf(s)
	if err != nil {
		return nil, err
	}
	if n <= 0 || k <= 0 || len(w) != n*k || (imp != nil && len(imp) != k) {
		return nil, fmt.Errorf("iquant: %d weights and %d importances for a %dx%d tensor", len(w), len(imp), n, k)
	}
	if err := s.CheckRowLength(k); err != nil {
		return nil, fmt.Errorf("iquant: %w", err)
	}
	return t, nil
}
