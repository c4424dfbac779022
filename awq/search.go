package awq

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/qpack-dev/qpack/blas"
	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/quant"
)

// Options tune the searches. The zero value is AutoAWQ's: 20 α points, a clipping search over
// 10 shrinks from 1.00 to 0.55 on 512 sampled tokens.
type Options struct {
	Grid       int     // α = k/Grid for k = 0..Grid-1 (default 20)
	ClipGrid   int     // shrink = 1 − i/ClipGrid (default 20)
	MaxShrink  float64 // shrinks down to 1 − MaxShrink, excluded (default 0.5)
	ClipTokens int     // tokens of the clipping search (default 512)
	// Duo divides the candidate by the weights' relative magnitude per input channel, as
	// AutoAWQ's duo_scaling: s = mean|x|^α / (mean|w|/absmax_group)^(1−α).
	Duo bool
}

func (o Options) grid() int {
	if o.Grid <= 0 {
		return 20
	}
	return o.Grid
}

func (o Options) clipSteps() (grid, steps int) {
	grid, shrink := o.ClipGrid, o.MaxShrink
	if grid <= 0 {
		grid = 20
	}
	if shrink <= 0 {
		shrink = 0.5
	}
	return grid, int(shrink * float64(grid))
}

func (o Options) clipTokens() int {
	if o.ClipTokens <= 0 {
		return 512
	}
	return o.ClipTokens
}

// Linear is one linear of a group: W [Out, In] row-major. Scheme is nil for a linear that is
// scaled with its group but not quantized (it then adds nothing to the loss).
type Linear struct {
	Name    string
	W       []float32
	Out, In int
	Scheme  *quant.Scheme
	// OnGPU, when not zero, holds the same W on the GPU (the model engine's copy), which
	// GPUSearch.SearchScale reads instead of uploading W.
	OnGPU cuda.DevicePtr
}

// ScaleResult is the outcome of SearchScale.
type ScaleResult struct {
	Scales []float32 // per input channel, normalised by sqrt(max·min)
	Alpha  float64   // the chosen exponent
	Loss   float64   // mean squared output error at Alpha
	Loss0  float64   // at α = 0 (s = 1: plain round-to-nearest)
	Losses []float64 // every candidate's loss, in α order
}

// Candidate is AWQ's scale for exponent alpha: s = max(mean|x|^α, 1e-4), divided by
// sqrt(max(s)·min(s)); non-finite entries become 1.
func Candidate(xMean []float32, alpha float64) []float32 {
	s := make([]float32, len(xMean))
	lo, hi := math.Inf(1), math.Inf(-1)
	for c, m := range xMean {
		v := math.Max(math.Pow(float64(m), alpha), 1e-4)
		s[c] = float32(v)
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	norm := float32(math.Sqrt(lo * hi))
	for c := range s {
		v := s[c] / norm
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			v = 1
		}
		s[c] = v
	}
	return s
}

// DuoCandidate is AutoAWQ's duo-scaling candidate max(mean|x|^α / (wMean^(1−α) + 1e-4), 1e-4),
// normalised like Candidate; without wMean it is Candidate.
func DuoCandidate(xMean, wMean []float32, alpha float64) []float32 {
	if wMean == nil {
		return Candidate(xMean, alpha)
	}
	x := make([]float32, len(xMean))
	for c, m := range xMean {
		x[c] = float32(math.Pow(float64(m), alpha) / (math.Pow(float64(wMean[c]), 1-alpha) + 1e-4))
	}
	return Candidate(x, 1)
}

// weightMean is, per input channel, the mean over all the group's rows of |w| divided by the
// absmax of its quantization group (AutoAWQ's w_mean).
func weightMean(ls []Linear, k int) []float32 {
	gs := k
	for _, l := range ls {
		if l.Scheme != nil && l.Scheme.GroupSize > 0 && l.Scheme.GroupSize < k {
			gs = l.Scheme.GroupSize
			break
		}
	}
	sum := make([]float64, k)
	rows := 0
	for _, l := range ls {
		am := groupAbsMax(l.W, l.Out, k, gs)
		groups := (k + gs - 1) / gs
		for r := range l.Out {
			for c, v := range l.W[r*k : (r+1)*k] {
				if m := am[r*groups+c/gs]; m > 0 {
					sum[c] += math.Abs(float64(v)) / float64(m)
				}
			}
		}
		rows += l.Out
	}
	out := make([]float32, k)
	for c, v := range sum {
		out[c] = float32(v / float64(max(rows, 1)))
	}
	return out
}

// SearchScale picks the α whose scale minimises the mean squared error of the group's
// fake-quantized outputs, ‖X·(Q(W·diag(s))·diag(s)⁻¹ − W)ᵀ‖², over the sampled input rows
// x [rows, K]: the GPU's quantity (GPUSearch), measured through the inputs' Gram matrix when
// that is cheaper (outputLoss). Ties keep the smaller α.
func SearchScale(x []float32, rows int, xMean []float32, ls []Linear, opt Options) (ScaleResult, error) {
	k := len(xMean)
	if rows <= 0 || len(x) < rows*k {
		return ScaleResult{}, fmt.Errorf("awq: %d input rows of %d channels, have %d values", rows, k, len(x))
	}
	count := 0
	for _, l := range ls {
		if l.In != k || len(l.W) != l.Out*l.In {
			return ScaleResult{}, fmt.Errorf("awq: %s is %dx%d with %d weights; the group input has %d channels", l.Name, l.Out, l.In, len(l.W), k)
		}
		if l.Scheme != nil {
			count += rows * l.Out
		}
	}
	var wMean []float32
	if opt.Duo {
		wMean = weightMean(ls, k)
	}
	out := newOutputLoss(x, rows, k)
	var xSq []float32 // E[x²] per channel, the importance of the IQ types' fits
	for _, l := range ls {
		if l.Scheme != nil && l.Scheme.Grid == quant.IQuant && xSq == nil {
			xSq = meanSquares(x, rows, k)
		}
	}
	best := ScaleResult{Loss: math.Inf(1), Losses: make([]float64, opt.grid())}
	var d []float32
	for step := range opt.grid() {
		alpha := float64(step) / float64(opt.grid())
		s := DuoCandidate(xMean, wMean, alpha)
		var sum float64
		for _, l := range ls {
			if l.Scheme == nil {
				continue
			}
			var err error
			if d, err = weightError(d, l, s, xSq); err != nil {
				return ScaleResult{}, err
			}
			sum += out.of(d, l.Out)
		}
		loss := sum / float64(max(count, 1))
		best.Losses[step] = loss
		if step == 0 {
			best.Loss0 = loss
		}
		if loss < best.Loss {
			best.Loss, best.Alpha, best.Scales = loss, alpha, s
		}
	}
	if best.Scales == nil {
		return best, fmt.Errorf("awq: no α gave a finite loss (%s)", ls[0].Name)
	}
	return best, nil
}

// outputLoss measures ‖X·Dᵀ‖², the squared output error over the sampled rows X [rows, k] that
// a weight error D [n, k] causes. With fewer channels than rows it uses the Gram matrix
// G = XᵀX, formed once: ‖X·Dᵀ‖² = Σ_r d_r·G·d_rᵀ costs n·k² multiply-adds per D instead of
// rows·k·n (a tenth at k = 384 over 8192 rows).
type outputLoss struct {
	x       []float32
	rows, k int
	gram    []float32 // k×k, nil when the direct product is cheaper
	buf     []float32
}

func newOutputLoss(x []float32, rows, k int) *outputLoss {
	o := &outputLoss{x: x[:rows*k], rows: rows, k: k}
	if k < rows {
		g := make([]float64, k*k)
		blas.SyrkT64(k, rows, 1, o.x, k, 0, g, k)
		o.gram = make([]float32, k*k)
		for i := range k {
			for j := i; j < k; j++ {
				o.gram[i*k+j], o.gram[j*k+i] = float32(g[i*k+j]), float32(g[i*k+j])
			}
		}
	}
	return o
}

// of returns ‖X·Dᵀ‖² for d [n, k], summed in float64.
func (o *outputLoss) of(d []float32, n int) float64 {
	if o.gram == nil {
		o.buf = grow(o.buf, o.rows*n)
		blas.SgemmNT(o.rows, n, o.k, o.x, o.k, d, o.k, o.buf, n)
		return dot64(o.buf, o.buf)
	}
	o.buf = grow(o.buf, n*o.k)
	blas.Sgemm(blas.NoTrans, blas.NoTrans, n, o.k, o.k, 1, d, o.k, o.gram, o.k, 0, o.buf, o.k)
	return dot64(o.buf, d)
}

// perRow sets dst[r] = ‖X·d_rᵀ‖² for each row r of d [n, k], summed in float64.
func (o *outputLoss) perRow(dst []float64, d []float32, n int) {
	dst = dst[:n]
	if o.gram == nil {
		o.buf = grow(o.buf, n*o.rows)
		blas.Sgemm(blas.NoTrans, blas.Trans, n, o.rows, o.k, 1, d, o.k, o.x, o.k, 0, o.buf, o.rows) // D·Xᵀ
		for r := range dst {
			e := o.buf[r*o.rows : (r+1)*o.rows]
			dst[r] = dot64(e, e)
		}
		return
	}
	o.buf = grow(o.buf, n*o.k)
	blas.Sgemm(blas.NoTrans, blas.NoTrans, n, o.k, o.k, 1, d, o.k, o.gram, o.k, 0, o.buf, o.k)
	for r := range dst {
		dst[r] = dot64(o.buf[r*o.k:(r+1)*o.k], d[r*o.k:(r+1)*o.k])
	}
}

// dot64 is Σ a[i]·b[i] summed in float64.
func dot64(a, b []float32) float64 {
	b = b[:len(a)]
	var s float64
	for i, v := range a {
		s += float64(v) * float64(b[i])
	}
	return s
}

// weightError returns Q(W·diag(s))·diag(s)⁻¹ − W in dst.
func weightError(dst []float32, l Linear, s, xSq []float32) ([]float32, error) {
	dst, err := fakeQuantScaled(dst, l, s, xSq)
	if err != nil {
		return nil, err
	}
	for i, w := range l.W {
		dst[i] -= w
	}
	return dst, nil
}

// fakeQuantScaled returns Q(W·diag(s))·diag(s)⁻¹ in dst. An IQ scheme is fitted with the
// importance its scaled inputs x/s would have, E[x²]/s² (xSq: E[x²]), as GPTQ then fits it.
func fakeQuantScaled(dst []float32, l Linear, s, xSq []float32) ([]float32, error) {
	dst = grow(dst, len(l.W))
	copy(dst, l.W)
	ScaleColumns(dst, l.Out, l.In, s)
	var imp []float32
	if l.Scheme.Grid == quant.IQuant {
		imp = make([]float32, l.In)
		for c := range imp {
			imp[c] = xSq[c] / (s[c] * s[c])
		}
	}
	if err := fakeQuantWith(dst, l.Out, l.In, *l.Scheme, imp); err != nil {
		return nil, fmt.Errorf("awq: %s: %w", l.Name, err)
	}
	for i := range dst {
		dst[i] /= s[i%l.In]
	}
	return dst, nil
}

// fakeQuant replaces w by its quantized-then-dequantized value under the real group quantizer.
func fakeQuant(w []float32, n, k int, s quant.Scheme) error { return fakeQuantWith(w, n, k, s, nil) }

// fakeQuantWith is fakeQuant with importance imp (nil: none) for the fit.
func fakeQuantWith(w []float32, n, k int, s quant.Scheme, imp []float32) error {
	t, err := blockwise.Quantize(w, n, k, s, blockwise.Options{Imatrix: imp != nil, Importance: imp})
	if err != nil {
		return err
	}
	t.Dequantize(w)
	return nil
}

// meanSquares is E[x²] of each of the k channels of x [rows, k].
func meanSquares(x []float32, rows, k int) []float32 {
	sum := make([]float64, k)
	for r := range rows {
		for c, v := range x[r*k : (r+1)*k] {
			sum[c] += float64(v) * float64(v)
		}
	}
	out := make([]float32, k)
	for c, v := range sum {
		out[c] = float32(v / float64(rows))
	}
	return out
}

// ScaleColumns multiplies column c of w [out, in] by s[c]: the linears after a folded scale.
func ScaleColumns(w []float32, out, in int, s []float32) {
	parallelRows(out, in, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			row := w[r*in : (r+1)*in]
			for c := range row {
				row[c] *= s[c]
			}
		}
	})
}

// DivideRows divides row r of w [out, in] by s[r]: the op before a folded scale (a norm weight
// or bias is a [out, 1] matrix).
func DivideRows(w []float32, out, in int, s []float32) {
	parallelRows(out, in, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			row := w[r*in : (r+1)*in]
			for c := range row {
				row[c] /= s[r]
			}
		}
	})
}

// parallelRows runs f over ranges of the n rows (of k values) on the machine's cores: folding
// and clamping touch every weight of a block, 200 M values in a 7B model.
func parallelRows(n, k int, f func(r0, r1 int)) {
	const perWorker = 1 << 18
	workers := min(runtime.GOMAXPROCS(0), max(1, n*k/perWorker), max(n, 1))
	if workers == 1 {
		f(0, n)
		return
	}
	step := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for r0 := 0; r0 < n; r0 += step {
		wg.Go(func() { f(r0, min(r0+step, n)) })
	}
	wg.Wait()
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}
