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
		t: newTensor(s, n, k, opt.GlobalScale), lay: newLayout(s, k, perm, opt.StaticGroups),
		k: k, groups: s.Groups(k), bs: opt.BlockSize, opt: opt,
	}
	p.kt, _ = kquant.TypeOf(s)
	p.it, _ = iquant.TypeOf(s)
	p.impOrig, p.imp = importance(diag, dead, perm)
	if err := p.loadWeights(opt.Work, w, dead); err != nil {
		return nil, st, err
	}
	factorStart := time.Now()
	u, err := inverseFactor(opt.Work, h, k, perm, dead, opt, &st)
	st.Factor = time.Since(factorStart)
	if err != nil {
		return nil, st, err
	}
	p.u = u
	if p.it != nil {
		p.cost = errorCosts(u, k)
	}
	errSq, err := p.run(n)
	if err != nil {
		return nil, st, err
	}
	p.t.GIdx = p.lay.gIdx()
	// With E the scaled errors, ΔW = W − Q = E·U and (H + λI)⁻¹ = UᵀU, so
	// tr(ΔW (H + λI) ΔWᵀ) = Σ err²: the proxy loss needs no product with H, only the
	// damping's share λ‖ΔW‖² taken off.
	st.Loss = max(0, errSq-st.Lambda*squaredError(p.t, w, dead))
	if opt.BaselineLoss {
		st.Baseline = baselineLoss(w, n, k, h, dead)
		st.RelativeLoss = st.Loss / st.Baseline
	}
	st.Total = time.Since(start)
	return p.t, st, nil
}

// problem is one quantization in progress: the working weights in quantization order and the
// inverse factor they are updated with, shared read-only by the row workers.
type problem struct {
	t  *quant.Tensor
	kt *kquant.Type // t's k-quant type, nil for other grids
	it *iquant.Type // t's IQ type, nil for other grids
	// cost[i] = 1/U_ii², GPTQ's cost of a unit error in column i (the loss adds (w − q)²/U_ii²):
	// the weights with which an IQ group is coded (IQ types only).
	cost []float32
	lay  layout
	w    []float32 // N×K working weights, column i is original column perm[i]
	u    []float32 // K×K upper Cholesky factor of the damped H⁻¹, in quantization order
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
// by one, spreading each column's error over the rest of the block, then push the block's
// errors to all later columns at once.
func (p *problem) quantizeRows(lo, hi int) (float64, error) {
	k, bs := p.k, p.bs
	errs := make([]float32, (hi-lo)*bs) // Err1: the block's scaled errors, one row per weight row
	f := newFitter(p.t, p.opt, p.lay.size)
	total := 0.0
	for i1 := 0; i1 < k; i1 += bs {
		i2 := min(i1+bs, k)
		for r := lo; r < hi; r++ {
			row := p.w[r*k : (r+1)*k]
			if err := p.fitGroupsStartingIn(f, r, row, i1, i2); err != nil {
				return 0, err
			}
			sum, err := p.quantizeBlock(f, r, row, i1, i2, errs[(r-lo)*bs:])
			if err != nil {
				return 0, err
			}
			if math.IsNaN(sum) || math.IsInf(sum, 0) {
				return 0, fmt.Errorf("gptq: row %d: the error feedback diverged in columns %d..%d (Hessian too ill-conditioned; raise the damping)", r, i1, i2-1)
			}
			total += sum
		}
		trailingUpdate(p.w, k, lo, hi, errs, bs, p.u, i1, i2)
	}
	return total, nil
}

// fitGroupsStartingIn fits the on-the-fly groups that start inside the block [i1, i2) of row r.
// Like the reference, which calls find_params(W[:, i:i+gs]) on the outer W, it reads the
// weights as they were before this block's own updates. FP4 blocks are fitted later, by
// quantizeBlock (fitsAtColumn).
func (p *problem) fitGroupsStartingIn(f *fitter, r int, row []float32, i1, i2 int) error {
	if p.fitsAtColumn() {
		return nil
	}
	for i := i1; i < i2; i++ {
		if p.lay.onTheFly(i) {
			if err := p.fitGroupAt(f, r, row, i); err != nil {
				return err
			}
		}
	}
	return nil
}

// fitGroupAt fits the group of row r that starts at quantization position i from the working
// weights row[i:].
func (p *problem) fitGroupAt(f *fitter, r int, row []float32, i int) error {
	hi := min(i+p.lay.size, p.k)
	return f.fit(r, p.lay.group(i), row[i:hi], p.imp[i:hi])
}

// quantizeBlock is the column loop of one row inside the block [i1, i2), in float32: quantize
// column i, err = (w − q)/U[i,i], W[i+1:i2] −= err·U[i, i+1:i2]. It stores the codes in original
// column order and the errors in errs[0:i2−i1], and returns Σ err² (float64). It fits the
// groups that fitsAtColumn leaves to it.
func (p *problem) quantizeBlock(f *fitter, r int, row []float32, i1, i2 int, errs []float32) (float64, error) {
	t, k := p.t, p.k
	sum := 0.0
	atColumn := p.fitsAtColumn()
	for i := i1; i < i2; i++ {
		if atColumn && p.lay.onTheFly(i) {
			if err := p.fitGroupAt(f, r, row, i); err != nil {
				return 0, err
			}
		}
		code, q := p.round(r, i, row)
		urow := p.u[i*k : i*k+i2]
		e := (row[i] - q) / urow[i]
		for j := i + 1; j < i2; j++ {
			row[j] -= e * urow[j]
		}
		errs[i-i1] = e
		if p.it == nil {
			t.Codes[r*k+p.lay.perm[i]] = code
		}
		sum += float64(e) * float64(e)
	}
	return sum, nil
}

// fitsAtColumn reports whether on-the-fly groups are fitted when the column loop reaches their
// first column, from the weights at that moment (all earlier columns' errors spread), rather
// than at the start of the block of columns. FP4 blocks are: their scale is searched against
// the weights it will code (newFitter), and on mid-llama the search on the weights the
// reference's groups see (before the block's own updates) gave 0.019 more perplexity (docs/fp4.md).
func (p *problem) fitsAtColumn() bool { return p.t.Scheme.IsFP4() }

// round rounds the weight of row r at quantization position i (row holds the row's working
// weights) with its group's fitted parameters: its code and the value the code stands for. An
// IQ type codes a whole group of adjacent weights when the loop reaches its first column, from
// their weights at that moment (all earlier columns' errors spread), weighted by GPTQ's costs;
// it stores the codes in the tensor itself.
func (p *problem) round(r, i int, row []float32) (uint8, float32) {
	if p.it != nil {
		col := p.lay.perm[i] // the identity: IQ types refuse act-order
		if gw := p.it.GroupWidth(); col%gw == 0 {
			p.it.CodeGroup(p.t, r, col, row[i:i+gw], p.cost[i:i+gw])
		}
		return 0, p.t.IQValue(r, col)
	}
	if p.kt != nil {
		return p.kt.Round(p.t, r, p.lay.perm[i], row[i])
	}
	return roundOne(p.t, row[i], r*p.groups+p.lay.group(i))
}

// errorCosts returns 1/U_ii² for each column of the k×k factor u.
func errorCosts(u []float32, k int) []float32 {
	c := make([]float32, k)
	for i := range c {
		d := float64(u[i*k+i])
		c[i] = float32(1 / (d * d))
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
	n, k := p.t.N, p.k
	ws.w = grow(ws.w, n*k)
	p.w = ws.w
	f := newFitter(p.t, p.opt, p.lay.size)
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
