package gptq

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// Quantize quantizes W[n, k] (float32, row-major, out × in) with GPTQ, given the Hessian
// h = 2/n Σ xᵀx of the layer's inputs (k×k, row-major, symmetric; Hessian.H). w and h are
// not modified. s must be an integer scheme. The tensor's codes, scales and zeros are exactly
// what the error feedback assumed: Dequantize gives the Q the algorithm optimised.
func Quantize(w []float32, n, k int, h []float64, s quant.Scheme, opt Options) (*quant.Tensor, Stats, error) {
	start := time.Now()
	var st Stats
	if err := checkInputs(w, n, k, h, s, opt); err != nil {
		return nil, st, err
	}
	opt = opt.withDefaults()
	diag := diagonal(h, k)
	dead, deadCount := deadColumns(diag)
	st.DeadColumns = deadCount
	perm := columnOrder(diag, dead, opt.ActOrder)
	if s.Grid == quant.NVFP4 && opt.GlobalScale == 0 {
		opt.GlobalScale = quant.NVFP4GlobalScale(absMax(w))
	}
	p := &problem{
		q: newTensor(s, n, k, opt.GlobalScale), lay: newLayout(s, k, perm, opt.StaticGroups),
		k: k, groups: s.Groups(k), bs: opt.BlockSize, opt: opt,
	}
	p.kt, _ = kquant.TypeOf(s)
	p.it, _ = iquant.TypeOf(s)
	p.impOrig, p.imp = importance(diag, dead, perm)
	if err := p.loadWeights(opt.Work, w, dead); err != nil {
		return nil, st, err
	}
	factorStart := time.Now()
	t, err := columnFactor(opt.Work, h, k, perm, dead, opt, &st)
	st.Factor = time.Since(factorStart)
	if err != nil {
		return nil, st, err
	}
	p.t, p.orig, p.dead = t, w, dead
	if p.it != nil {
		p.cost = errorCosts(t, k)
	}
	errSq, err := p.run(n)
	if err != nil {
		return nil, st, err
	}
	p.q.GIdx = p.lay.gIdx()
	// With E the scaled errors, ΔW = W − Q = E·U and (H + λI)⁻¹ = UᵀU, so
	// tr(ΔW (H + λI) ΔWᵀ) = Σ err²: the proxy loss needs no product with H, only the
	// damping's share λ‖ΔW‖² taken off.
	st.Loss = max(0, errSq-st.Lambda*squaredError(p.q, w, dead))
	if opt.BaselineLoss {
		st.Baseline = baselineLoss(w, n, k, h, dead)
		st.RelativeLoss = st.Loss / st.Baseline
	}
	st.Total = time.Since(start)
	return p.q, st, nil
}

// problem is one quantization in progress: the working weights in quantization order and the
// column factor they are updated with, shared read-only by the row workers.
type problem struct {
	q  *quant.Tensor
	kt *kquant.Type // q's k-quant type, nil for other grids
	it *iquant.Type // q's IQ type, nil for other grids
	// cost[i] = T_ii², GPTQ's cost of a unit error in column i (the loss adds (w − q)²·T_ii²):
	// the weights with which an IQ group is coded (IQ types only).
	cost []float32
	lay  layout
	w    []float32 // N×K working weights, column i is original column perm[i]
	t    []float32 // K×K column factor T′ (columnFactor), in quantization order
	orig []float32 // N×K weights as given: d_i = W_i − q_i reads them (dead columns as zero)
	dead []bool    // by original column
	k    int
	// groups is the number of groups per row: the row stride of t.Scales (not for k-quants).
	groups int
	bs     int
	opt    Options
	// imp is diag H in quantization order, impOrig in the original order: the Imatrix
	// search's importance.
	imp, impOrig []float32
}

// run quantizes all rows; rows are independent given U, so each worker owns a range of rows
// from the first block to the last. It returns Σ err² over all weights.
func (p *problem) run(n int) (float64, error) {
	workers := min(runtime.GOMAXPROCS(0), n)
	sums := make([]float64, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() { sums[i], errs[i] = p.quantizeRows(i*n/workers, (i+1)*n/workers) })
	}
	wg.Wait()
	total := 0.0
	for i := range workers {
		if errs[i] != nil {
			return 0, errs[i]
		}
		total += sums[i]
	}
	return total, nil
}

// quantizeRows is the reference's block loop for rows [lo, hi): quantize a block of columns one
// by one, spreading each column's difference from the original weights over the rest of the
// block, then push the block's differences to all later columns at once.
func (p *problem) quantizeRows(lo, hi int) (float64, error) {
	k, bs := p.k, p.bs
	diffs := make([]float32, (hi-lo)*bs) // the block's W − Q, one row per weight row
	f := newFitter(p.q, p.opt, p.lay.size)
	total := 0.0
	for i1 := 0; i1 < k; i1 += bs {
		i2 := min(i1+bs, k)
		for r := lo; r < hi; r++ {
			row := p.w[r*k : (r+1)*k]
			if err := p.fitGroupsStartingIn(f, r, row, i1, i2); err != nil {
				return 0, err
			}
			sum, err := p.quantizeBlock(f, r, row, i1, i2, diffs[(r-lo)*bs:])
			if err != nil {
				return 0, err
			}
			if math.IsNaN(sum) || math.IsInf(sum, 0) {
				return 0, fmt.Errorf("gptq: row %d: the error feedback diverged in columns %d..%d (Hessian too ill-conditioned; raise the damping)", r, i1, i2-1)
			}
			total += sum
		}
		trailingUpdate(p.w, k, lo, hi, diffs, bs, p.t, i1, i2)
	}
	return total, nil
}

// fitGroupsStartingIn fits the on-the-fly groups that start inside the block [i1, i2) of row r.
// Like the reference, which calls find_params(W[:, i:i+gs]) on the outer W, it reads the
// weights as they were before this block's own updates (settled from i1). FP4 blocks are fitted
// later, by quantizeBlock (fitsAtColumn).
func (p *problem) fitGroupsStartingIn(f *fitter, r int, row []float32, i1, i2 int) error {
	if p.fitsAtColumn() {
		return nil
	}
	var settled []float32
	for i := i1; i < i2; i++ {
		if p.lay.onTheFly(i) {
			if settled == nil { // up to the end of the last group starting in the block
				settled = p.settled(f, r, row, i1, min((i2-1)/p.lay.size*p.lay.size+p.lay.size, p.k))
			}
			if err := p.fitGroupAt(f, r, settled[i-i1:], i); err != nil {
				return err
			}
		}
	}
	return nil
}

// fitGroupAt fits the group of row r that starts at quantization position i from the weights
// w[0:], those of positions i on.
func (p *problem) fitGroupAt(f *fitter, r int, w []float32, i int) error {
	hi := min(i+p.lay.size, p.k)
	return f.fit(r, p.lay.group(i), w[:hi-i], p.imp[i:hi])
}

// settled returns the weights of positions [from, to) of row r as the reference has them when
// its column loop reaches from: W − Σ_{l<from} e_l·U_l·, what its group fits read. The working
// row here holds P = W + Σ_{l<from} d_l·T′_l· instead (the same value at from itself, not
// after it); with y = P − W on [from, to) solved against T's diagonal block there,
// y_j ← y_j − Σ_{from≤l<j} y_l·T′_lj, the reference's weights are W + y. (Both sums are
// D_<·T_<,≥ times the inverse of a triangular factor of the rest: T_≥'s diagonal for P, all of
// T_≥ for the reference, as U_<,≥ = −T_<<⁻¹·T_<≥·T_≥≥⁻¹.) The result lives in f's scratch.
func (p *problem) settled(f *fitter, r int, row []float32, from, to int) []float32 {
	k := p.k
	f.settled = grow(f.settled, to-from)
	y := f.settled
	for j := from; j < to; j++ {
		y[j-from] = row[j] - p.original(r, j)
	}
	for l := from; l < to; l++ {
		yl, trow := y[l-from], p.t[l*k:(l+1)*k]
		for j := l + 1; j < to; j++ {
			y[j-from] -= yl * trow[j]
		}
	}
	for j := from; j < to; j++ {
		y[j-from] += p.original(r, j)
	}
	return y
}

// quantizeBlock is the column loop of one row inside the block [i1, i2), in float32: quantize
// column i, d = W_i − q (W the weights as given), w[i+1:i2] += d·T′[i, i+1:i2]. It stores the
// codes in original column order and the differences in diffs[0:i2−i1], and returns Σ e² with
// e = (w_i − q)·T_ii (float64), the reference's scaled errors. It fits the groups that
// fitsAtColumn leaves to it.
func (p *problem) quantizeBlock(f *fitter, r int, row []float32, i1, i2 int, diffs []float32) (float64, error) {
	t, k := p.q, p.k
	sum := 0.0
	atColumn := p.fitsAtColumn()
	for i := i1; i < i2; i++ {
		if atColumn && p.lay.onTheFly(i) {
			if err := p.fitGroupAt(f, r, p.settled(f, r, row, i, min(i+p.lay.size, k)), i); err != nil {
				return 0, err
			}
		}
		code, q := p.round(f, r, i, row)
		trow := p.t[i*k : i*k+i2]
		d := p.original(r, i) - q
		for j := i + 1; j < i2; j++ {
			row[j] += d * trow[j]
		}
		diffs[i-i1] = d
		if p.it == nil {
			t.Codes[r*k+p.lay.perm[i]] = code
		}
		e := (row[i] - q) * trow[i]
		sum += float64(e) * float64(e)
	}
	return sum, nil
}

// original is the weight of row r at quantization position i as given, zero in a dead column.
func (p *problem) original(r, i int) float32 {
	if c := p.lay.perm[i]; !p.dead[c] {
		return p.orig[r*p.k+c]
	}
	return 0
}

// fitsAtColumn reports whether on-the-fly groups are fitted when the column loop reaches their
// first column, from the weights at that moment (all earlier columns' errors spread), rather
// than at the start of the block of columns. FP4 blocks are: their scale is searched against
// the weights it will code (newFitter), and on mid-llama the search on the weights the
// reference's groups see (before the block's own updates) gave 0.019 more perplexity (docs/fp4.md).
func (p *problem) fitsAtColumn() bool { return p.q.Scheme.IsFP4() }

// round rounds the weight of row r at quantization position i (row holds the row's working
// weights) with its group's fitted parameters: its code and the value the code stands for. An
// IQ type codes a whole group of adjacent weights when the loop reaches its first column, from
// their weights at that moment (all earlier columns' errors spread: settled), weighted by GPTQ's
// costs; it stores the codes in the tensor itself.
func (p *problem) round(f *fitter, r, i int, row []float32) (uint8, float32) {
	if p.it != nil {
		col := p.lay.perm[i] // the identity: IQ types refuse act-order
		if gw := p.it.GroupWidth(); col%gw == 0 {
			p.it.CodeGroup(p.q, r, col, p.settled(f, r, row, i, i+gw), p.cost[i:i+gw])
		}
		return 0, p.q.IQValue(r, col)
	}
	if p.kt != nil {
		return p.kt.Round(p.q, r, p.lay.perm[i], row[i])
	}
	return roundOne(p.q, row[i], r*p.groups+p.lay.group(i))
}

// errorCosts returns T_ii² for each column of the k×k column factor t.
func errorCosts(t []float32, k int) []float32 {
	c := make([]float32, k)
	for i := range c {
		d := float64(t[i*k+i])
		c[i] = float32(d * d)
	}
	return c
}

// roundOne rounds one weight to the nearest value of t's grid with the parameters of group i
// (index into Scales): its code and the value the code stands for.
func roundOne(t *quant.Tensor, w float32, i int) (uint8, float32) {
	scale := t.Scales[i]
	switch t.Scheme.Grid {
	case quant.NF4:
		code := quant.NF4Code(w / scale)
		return code, quant.DequantizeNF4(code, scale)
	case quant.NVFP4, quant.MXFP4:
		f := t.FP4Factor(scale)
		code := fp.F32ToE2M1(w / f)
		return code, quant.FP4Values[code] * f
	}
	code := t.Scheme.QuantizeInt(w, scale, t.Zeros[i])
	return code, quant.DequantizeInt(code, scale, t.Zeros[i])
}

// loadWeights fits the parameters that precede all updates (per-channel, static groups) and
// fills the working weights: W with dead columns zeroed, columns in quantization order.
func (p *problem) loadWeights(ws *Workspace, w []float32, dead []bool) error {
	n, k := p.q.N, p.k
	ws.w = grow(ws.w, n*k)
	p.w = ws.w
	f := newFitter(p.q, p.opt, p.lay.size)
	row := make([]float32, k)
	for r := range n {
		if err := f.fitBeforeUpdates(p.lay, w, r, dead, row, p.impOrig); err != nil {
			return err
		}
		dst := p.w[r*k : (r+1)*k]
		for i, c := range p.lay.perm {
			if !dead[c] {
				dst[i] = w[r*k+c]
			} else {
				dst[i] = 0
			}
		}
	}
	return nil
}

// newTensor allocates an n×k tensor of scheme s (integer, NF4, FP4, k-quant or IQ grid); global
// is an NVFP4 tensor's global scale.
func newTensor(s quant.Scheme, n, k int, global float32) *quant.Tensor {
	if s.Grid == quant.KQuant {
		return quant.NewKQuantTensor(s, n, k)
	}
	if s.Grid == quant.IQuant {
		return quant.NewIQuantTensor(s, n, k)
	}
	ng := n * s.Groups(k)
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k), Scales: make([]float32, ng), GlobalScale: global}
	if s.Grid == quant.Integer {
		t.Zeros = make([]uint8, ng)
	}
	return t
}
