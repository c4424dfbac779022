package gptq

import (
	"fmt"
	"math"
	"slices"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// diagonal returns diag H of the k×k matrix h.
func diagonal(h []float64, k int) []float64 {
	d := make([]float64, k)
	for i := range d {
		d[i] = h[i*k+i]
	}
	return d
}

// deadColumns marks the input channels that never saw a non-zero input (H_ii == 0), from diag H.
func deadColumns(diag []float64) (dead []bool, count int) {
	k := len(diag)
	dead = make([]bool, k)
	for i := range k {
		if diag[i] == 0 {
			dead[i] = true
			count++
		}
	}
	return dead, count
}

// columnOrder returns the order in which columns are quantized: perm[i] is the original column
// at position i. With actOrder it sorts by decreasing diag H (dead columns count as 1, as after
// the reference's fix), ties kept in column order; otherwise it is the identity.
func columnOrder(diag []float64, dead []bool, actOrder bool) []int {
	k := len(diag)
	perm := make([]int, k)
	for i := range perm {
		perm[i] = i
	}
	if actOrder {
		slices.SortStableFunc(perm, func(a, b int) int {
			da, db := diagFixed(diag[a], dead[a]), diagFixed(diag[b], dead[b])
			switch {
			case da > db:
				return -1
			case da < db:
				return 1
			}
			return 0
		})
	}
	return perm
}

// layout says which group (index into one row of the tensor's scales and zeros) each
// quantization position uses, and when a group's parameters are fitted.
type layout struct {
	size       int // columns per group (K when per-channel)
	perChannel bool
	static     bool
	perm       []int
}

func newLayout(s quant.Scheme, k int, perm []int, static bool) layout {
	l := layout{size: s.GroupSize, perm: perm, static: static}
	switch {
	case s.Grid == quant.KQuant:
		l.size = quant.SuperBlock // a super-block's parameters are fitted together
	case s.Grid == quant.IQuant:
		f, _ := s.IQuant()
		l.size = f.Block // so are an IQ block's
	case s.GroupSize == quant.PerChannel:
		l.size, l.perChannel, l.static = k, true, false
	}
	return l
}

// group returns the group used by the column at position i: groups follow the quantization
// order when fitted on the fly, the original order when static.
func (l layout) group(i int) int {
	switch {
	case l.perChannel:
		return 0
	case l.static:
		return l.perm[i] / l.size
	}
	return i / l.size
}

// onTheFly reports whether the group starting at position i is fitted during the column loop.
func (l layout) onTheFly(i int) bool { return !l.perChannel && !l.static && i%l.size == 0 }

// gIdx returns the tensor's GIdx: nil when column c is in group c / size (no act-order, static
// groups, per-channel), else g_idx[perm[i]] = i / size.
func (l layout) gIdx() []int32 {
	if l.perChannel || l.static || slices.IsSorted(l.perm) {
		return nil
	}
	g := make([]int32, len(l.perm))
	for i, c := range l.perm {
		g[c] = int32(i / l.size)
	}
	return g
}

// fitter computes one group's parameters and stores them in the tensor.
type fitter struct {
	t     *quant.Tensor
	kt    *kquant.Type      // the k-quant type of t, nil for other grids
	it    *iquant.Type      // the IQ type of t, nil for other grids
	opt   blockwise.Options // the search: Clip or Imatrix
	codes []uint8           // scratch for the searches, len ≥ group size
	// settled is scratch for the weights that a fit reads (problem.settled)
	settled []float32
}

// newFitter's FP4 fits always search the block scale, weighted by diag H (blockwise's imatrix
// search over the representable E4M3 or E8M0 scales near the min-max one), as the IQ fits always
// take diag H: with 8 E4M3 values an octave (one E8M0), rounding the min-max scale to the
// nearest one saturates the block's largest weights or wastes the grid's top. On the shared
// models the search (with the late fit, fitsAtColumn) took 0.007–0.058 off GPTQ's perplexity
// (docs/fp4.md).
func newFitter(t *quant.Tensor, opt Options, size int) *fitter {
	kt, _ := kquant.TypeOf(t.Scheme)
	it, _ := iquant.TypeOf(t.Scheme)
	return &fitter{t: t, kt: kt, it: it, codes: make([]uint8, size),
		opt: blockwise.Options{Clip: opt.Clip, Imatrix: opt.Imatrix || t.Scheme.IsFP4(), GlobalScale: t.GlobalScale}}
}

// fit sets the parameters of row r, group g from the weights w of that group; imp (len(w) or
// nil) weights the imatrix search. A k-quant group is a super-block, fitted by ggml's
// algorithm (with imp: its imatrix variant); so is an IQ block, always with imp: ggml designed
// the IQ fits around an importance matrix (several have no variant without one), and on test
// layers the fit without it left GPTQ's loss 2–6 times higher.
func (f *fitter) fit(r, g int, w, imp []float32) error {
	if f.it != nil {
		p, err := f.it.Fit(w, imp)
		if err != nil {
			return fmt.Errorf("gptq: row %d, block %d: %w", r, g, err)
		}
		f.it.Put(f.t, r, g, &p)
		return nil
	}
	if !f.opt.Imatrix {
		imp = nil
	}
	if f.kt != nil {
		p, err := f.kt.Fit(w, imp, f.codes)
		if err != nil {
			return fmt.Errorf("gptq: row %d, super-block %d: %w", r, g, err)
		}
		f.kt.Put(f.t, r, g, &p)
		return nil
	}
	scale, zero := blockwise.GroupParams(f.t.Scheme, w, imp, f.opt, f.codes)
	if math.IsInf(float64(scale), 0) {
		return fmt.Errorf("gptq: row %d, group %d: scale overflows F16 (weights up to %g)", r, g, absMax(w))
	}
	i := r*f.t.Scheme.Groups(f.t.K) + g
	f.t.Scales[i] = scale
	if f.t.Zeros != nil { // integer grid
		f.t.Zeros[i] = zero
	}
	return nil
}

// fitBeforeUpdates fits the parameters that do not depend on the updates: per-channel ones
// from the whole row as given (the reference fits the layer's quantizer before it zeroes dead
// columns), static groups from the row with dead columns zeroed, in the original order. row is
// scratch of length K; imp is diag H in the original order.
func (f *fitter) fitBeforeUpdates(l layout, w []float32, r int, dead []bool, row, imp []float32) error {
	k := f.t.K
	if l.perChannel {
		return f.fit(r, 0, w[r*k:(r+1)*k], imp)
	}
	if !l.static {
		return nil
	}
	copyZeroingDead(row, w[r*k:(r+1)*k], dead)
	for g := 0; g*l.size < k; g++ {
		lo, hi := g*l.size, min((g+1)*l.size, k)
		if err := f.fit(r, g, row[lo:hi], imp[lo:hi]); err != nil {
			return err
		}
	}
	return nil
}

func copyZeroingDead(dst, src []float32, dead []bool) {
	for c, v := range src {
		if dead[c] {
			v = 0
		}
		dst[c] = v
	}
}

// importance returns diag H as float32 in the original column order and in quantization
// order (position i: column perm[i]), the weights of the imatrix search; dead columns get 0.
func importance(diag []float64, dead []bool, perm []int) (orig, ordered []float32) {
	orig = make([]float32, len(diag))
	ordered = make([]float32, len(diag))
	for c, v := range diag {
		if !dead[c] {
			orig[c] = float32(v)
		}
	}
	for i, c := range perm {
		ordered[i] = orig[c]
	}
	return orig, ordered
}

func absMax(w []float32) float32 {
	var m float32
	for _, v := range w {
		m = max(m, float32(math.Abs(float64(v))))
	}
	return m
}
