package gptq

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/timeline"
	"github.com/qpack-dev/qpack/quant"
	"golang.org/x/sync/errgroup"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/gptq.cu

var (
	//go:embed kernels/gptq.ptx
	gptqPTX []byte
	//go:embed kernels/gptq.sm_90.cubin
	gptqCubinSM90 []byte // the PTX assembled for the H100/H200: no JIT there
	//go:embed kernels/gptq.cu
	gptqSource []byte
)

// solverStagingBytes is a solver's pinned memory. In a calibration it moves the codes and group
// parameters of a linear's rows (the weights and H are on the device already), while the next
// forward pass runs; pinning costs about 0.4 ms a MiB, and the GPUs of one host pin one after
// another: with 64 MiB, each of four H100s took 130 ms to make a solver where one alone took 25.
const solverStagingBytes = 8 << 20

// Constants of kernels/gptq.cu.
const (
	gpuBlockSize = 128 // BS
	gpuRowsPerCB = 8   // WARPS: rows per thread block of gptq_block
)

// GPUSolver runs GPTQ on one GPU: the same algorithm as Quantize, with the damped Hessian's
// Cholesky factor in float64 (cuSOLVER; T′ from it is a Factor, which several solves may
// share), the column loop of each
// block of 128 columns in one kernel (a warp per row), and each block's trailing update as a
// cuBLAS float32 GEMM. Groups are fitted min-max, or with the searches of Options.Imatrix and
// Options.Clip (gptq_fit_search: a warp per group, the CPU's arithmetic in the CPU's order):
// per-channel and static groups before the column loop, on-the-fly groups when their block
// begins. It keeps its kernels, handles and device buffers (grown to the largest
// problem seen) between calls; it is not safe for concurrent use.
type GPUSolver struct {
	dev    *cuda.Device
	module *cuda.Module
	fn     struct{ buildFactor, unreverse, copyBlock, loadWeights, fitFixed, fitSearch, settle, block, squaredError, gramDiagonal, live, narrow, rowDot, dequantize, firstNonFinite cuda.Function }
	blas   *cuda.BLAS
	solver *cuda.Solver
	stream cuda.Stream
	stager *cuda.Stager // uploads W and H through pinned memory
	bufs   [numGPUSlots]gpuBuffer

	poison  bool        // tests: fill outputs and scratch with garbage before each run
	profile *gpuProfile // when set, each phase is timed with events
	into    *rowsOf     // during QuantizeGramRows: where run puts its results
	solved  gpuPlan     // the last run's problem (DequantizeTo)
	// generation counts the factorisations made (and Close): a Factor of an older one is gone
	generation uint64
	// resident: the weights are checked on the device (QuantizeGramResident: the engine's copy,
	// equal to w, which the host need not scan again before every solve)
	resident bool
	// finishing is closed when the last SolveFactored's Results has returned (nil: none pending)
	finishing chan struct{}
	// h is where the factorisation under way reads H
	h hSource
}

// hSource is where a factorisation reads H: the float64 matrix in slotH (Quantize's H from the
// host, the warm-up's) when gram is 0, else a calibration's K×K float32 Gram matrix times scale
// (FactorGram), each entry widened and scaled as it is read: the same doubles, without slotH's
// 8·K² bytes (68 GB of a 405B's down_proj, K = 53248, would not leave room on an 80 GB GPU).
type hSource struct {
	gram  cuda.DevicePtr
	scale float64
}

// hArgs are the kernels' arguments for H (h_entry in kernels/gptq.cu): slotH, or no matrix and
// the Gram matrix with its scale.
func (g *GPUSolver) hArgs() (h, gram cuda.DevicePtr, scale float64) {
	if g.h.gram != 0 {
		return 0, g.h.gram, g.h.scale
	}
	return g.bufs[slotH].ptr, 0, 1
}

// rowsOf is rows [row, row+n) of a tensor that QuantizeGramRows fills.
type rowsOf struct {
	dst *quant.Tensor
	row int
}

type gpuBuffer struct {
	ptr  cuda.DevicePtr
	size int
}

// Device buffer slots.
const (
	slotH        = iota // K×K float64 Hessian as given
	slotFactor          // K×K float64 cuSOLVER matrix
	slotH32             // K×K float32 H (Factor.h32)
	slotT               // K×K float32 column factor T′ (Factor.t)
	slotOrig            // N×K float32 weights as given
	slotW               // N×K float32 working weights
	slotDiff            // N×128 float32 block differences W − Q
	slotCodes           // N×K uint8
	slotScales          // N×groups float32
	slotZeros           // N×groups uint8
	slotPerm            // K int32
	slotRev             // K int32
	slotPosGroup        // K int32
	slotColGroup        // K int32
	slotDead            // K uint8
	slotRowSq           // N float64
	slotRowDq           // N float64
	slotFlags           // status (uint64), potrf info, bad (int32 each), at flagNonFinite the first non-finite weight (uint64)
	slotBaseWH          // N×K float32: the weights settled for the group fits (gptq_settle), then W·H for the baseline loss
	slotBaseRows        // N float64 row sums of W·H∘W; loadGram borrows it for diag H
	slotImpOrig         // K float32 diag H in the original order (Options.Imatrix)
	slotImpPos          // K float32 diag H in quantization order (Options.Imatrix)
	slotInfos           // int32 potrf infos of a shared factorisation's leaves (choleskyShared)
	numGPUSlots
)

// flagNonFinite is the byte offset in slotFlags of the index of the first non-finite weight of
// resident weights (gptq_first_non_finite), all ones when there is none.
const flagNonFinite = 24

// gpuProfile accumulates the device time of each phase, measured with CUDA events.
type gpuProfile struct {
	phases  [numPhases]time.Duration
	pending []pendingSpan
}

// Profiled phases: the Cholesky factorisation (with building the damped matrix and T′), the
// column kernels, the trailing GEMMs, the searched group fits (gptq_fit_search), the rest.
const (
	phaseCholesky = iota
	phaseColumns
	phaseGEMMs
	phaseFit
	phaseOther
	numPhases
)

type pendingSpan struct {
	phase      int
	start, end cuda.Event
}

// NewGPUSolver loads the kernels, cuBLAS and cuSOLVER on dev.
func NewGPUSolver(dev *cuda.Device) (*GPUSolver, error) {
	return newGPUSolver(dev, gptqPTX, gptqCubinSM90)
}

// newGPUSolver is NewGPUSolver with kernels ptx, or the one of cubins built for dev's architecture.
func newGPUSolver(dev *cuda.Device, ptx []byte, cubins ...[]byte) (g *GPUSolver, err error) {
	g = &GPUSolver{dev: dev}
	defer func() {
		if err != nil {
			g.Close()
			g = nil
		}
	}()
	if g.module, err = dev.LoadModuleFor(ptx, cubins...); err != nil {
		return nil, fmt.Errorf("gptq: loading kernels/gptq.ptx: %w", err)
	}
	for _, f := range []struct {
		dst  *cuda.Function
		name string
	}{
		{&g.fn.buildFactor, "gptq_build_factor"}, {&g.fn.unreverse, "gptq_unreverse"}, {&g.fn.copyBlock, "gptq_copy_block"},
		{&g.fn.loadWeights, "gptq_load_weights"}, {&g.fn.fitFixed, "gptq_fit_fixed"}, {&g.fn.fitSearch, "gptq_fit_search"},
		{&g.fn.settle, "gptq_settle"}, {&g.fn.block, "gptq_block"}, {&g.fn.squaredError, "gptq_squared_error"},
		{&g.fn.gramDiagonal, "gptq_gram_diagonal"}, {&g.fn.live, "gptq_live"}, {&g.fn.narrow, "gptq_narrow"}, {&g.fn.rowDot, "gptq_row_dot"},
		{&g.fn.dequantize, "gptq_dequantize"}, {&g.fn.firstNonFinite, "gptq_first_non_finite"},
	} {
		if *f.dst, err = g.module.Function(f.name); err != nil {
			return nil, err
		}
	}
	if g.stream, err = dev.NewStream(); err != nil {
		return nil, err
	}
	// The pinned buffer and the two handles are made at once: each waits for the driver a
	// while (tens of milliseconds, more with several GPUs), and the first solve waits for all.
	var making errgroup.Group
	making.Go(func() (err error) {
		g.stager, err = dev.NewStager(solverStagingBytes)
		return err
	})
	making.Go(func() (err error) {
		if g.blas, err = dev.NewBLAS(); err != nil {
			return fmt.Errorf("gptq: the GPU path needs cuBLAS: %w", err)
		}
		return g.blas.SetStream(g.stream)
	})
	making.Go(func() (err error) {
		if g.solver, err = dev.NewSolver(); err != nil {
			return fmt.Errorf("gptq: the GPU path needs cuSOLVER: %w", err)
		}
		return g.solver.SetStream(g.stream)
	})
	if err = making.Wait(); err != nil {
		return nil, err
	}
	return g, nil
}

// Close releases the solver's memory, handles, stream and kernels.
func (g *GPUSolver) Close() error {
	g.settle()
	g.generation++
	var errs []error
	if g.stager != nil {
		errs = append(errs, g.stager.Close())
		g.stager = nil
	}
	for i := range g.bufs {
		if g.bufs[i].size > 0 {
			errs = append(errs, g.dev.Free(g.bufs[i].ptr))
			g.bufs[i] = gpuBuffer{}
		}
	}
	if g.solver != nil {
		errs = append(errs, g.solver.Close())
		g.solver = nil
	}
	if g.blas != nil {
		errs = append(errs, g.blas.Close())
		g.blas = nil
	}
	if g.stream != 0 {
		errs = append(errs, g.dev.DestroyStream(g.stream))
		g.stream = 0
	}
	if g.module != nil {
		errs = append(errs, g.module.Unload())
		g.module = nil
	}
	return errors.Join(errs...)
}

// QuantizeGPU is Quantize on GPU dev: a GPUSolver for one call.
func QuantizeGPU(dev *cuda.Device, w []float32, n, k int, h []float64, s quant.Scheme, opt Options) (*quant.Tensor, Stats, error) {
	g, err := NewGPUSolver(dev)
	if err != nil {
		return nil, Stats{}, err
	}
	t, st, err := g.Quantize(w, n, k, h, s, opt)
	if cerr := g.Close(); err == nil && cerr != nil {
		return nil, st, cerr
	}
	return t, st, err
}

// Quantize is gptq.Quantize on the GPU: same inputs, same meaning of the result. Codes agree
// with the CPU except where a weight lies within float32 rounding of a rounding tie (the
// trailing GEMM sums in another order); group parameters fitted before the column loop
// (per-channel, static) agree exactly, and so do on-the-fly ones given the same weights. The
// block size must be 128.
func (g *GPUSolver) Quantize(w []float32, n, k int, h []float64, s quant.Scheme, opt Options) (*quant.Tensor, Stats, error) {
	g.settle()
	start := time.Now()
	if err := checkInputs(w, n, k, h, s, opt); err != nil {
		return nil, Stats{}, err
	}
	if err := g.supports(s, opt); err != nil {
		return nil, Stats{}, err
	}
	if err := g.upload(slotH, cuda.Bytes(h)); err != nil {
		return nil, Stats{}, err
	}
	g.h = hSource{}
	f, err := factorAll([]*GPUSolver{g}, diagonal(h, k), k, opt, start)
	if err != nil {
		return nil, Stats{}, err
	}
	return finished(g.solveRows(nil, 0, w, 0, n, f[0], s, opt, start))
}

// Supports reports whether the GPU solver handles scheme s with options opt: integer grids,
// with min-max, imatrix or clip group fits, in blocks of 128 columns. GPTQ on NF4 and FP4 runs on the
// CPU (Quantize), and so does clip search where the GPU cannot reproduce this process's math.Pow (not
// amd64).
func (g *GPUSolver) Supports(s quant.Scheme, opt Options) bool { return g.supports(s, opt) == nil }

func (g *GPUSolver) supports(s quant.Scheme, opt Options) error {
	if s.Grid != quant.Integer {
		return fmt.Errorf("gptq: the GPU solver handles integer grids, not %s (use gptq.Quantize)", s)
	}
	if opt.BlockSize != 0 && opt.BlockSize != gpuBlockSize {
		return fmt.Errorf("gptq: the GPU path uses blocks of %d columns, not %d", gpuBlockSize, opt.BlockSize)
	}
	if opt.Clip && !opt.Imatrix {
		if _, ok := clipPowPath(); !ok {
			return fmt.Errorf("gptq: the GPU cannot reproduce math.Pow on %s, which the clip search uses (use gptq.Quantize)", runtime.GOARCH)
		}
	}
	return nil
}

// QuantizeGram is Quantize with the Hessian on the device, as the calibration gathers it: H =
// scale·gram, gram a k×k float32 Gram matrix Σ xᵀx (scale = 2/rows), factored there
// (FactorGram). gram is read before QuantizeGram returns.
func (g *GPUSolver) QuantizeGram(w []float32, n, k int, gram cuda.DevicePtr, scale float64, s quant.Scheme, opt Options) (*quant.Tensor, Stats, error) {
	return g.QuantizeGramRows(nil, 0, w, 0, n, k, gram, scale, s, opt)
}

// QuantizeGramResident is QuantizeGram for weights that are on the device already at src
// (float32, row-major: a calibration engine's copy of w, which is still what is checked): they
// are copied there instead of sent again over the bus. Work queued on other streams that writes
// src must be finished.
func (g *GPUSolver) QuantizeGramResident(w []float32, src cuda.DevicePtr, n, k int, gram cuda.DevicePtr, scale float64, s quant.Scheme, opt Options) (*quant.Tensor, Stats, error) {
	return g.QuantizeGramRows(nil, 0, w, src, n, k, gram, scale, s, opt)
}

// QuantizeGramRows is QuantizeGramResident (QuantizeGram when src is 0) for rows [row, row+n)
// of a weight of dst.N rows, whose tensor the caller made with NewRowsTensor: the codes and group
// parameters go straight into dst's rows, so that solvers on several GPUs fill one tensor at once
// instead of joining theirs. It returns those rows as a tensor sharing dst's memory, with the
// column order (GIdx) that the caller gives dst. dst nil: a tensor of the n rows alone.
func (g *GPUSolver) QuantizeGramRows(dst *quant.Tensor, row int, w []float32, src cuda.DevicePtr, n, k int, gram cuda.DevicePtr, scale float64, s quant.Scheme, opt Options) (*quant.Tensor, Stats, error) {
	g.settle()
	start := time.Now()
	if err := g.checkSolve(dst, row, w, src, n, k, s, opt); err != nil {
		return nil, Stats{}, err
	}
	f, err := g.FactorGram(gram, k, scale, opt)
	if err != nil {
		return nil, Stats{}, err
	}
	return finished(g.solveRows(dst, row, w, src, n, f, s, opt, start))
}

// QuantizeFactored is QuantizeGramRows with the Hessian factored already (FactorGram,
// FactorGramOnAll) on this solver's GPU, by this solver or another of that GPU: the solves of
// a group's linears (q, k and v), and their row shares on several GPUs, share one factorisation.
func (g *GPUSolver) QuantizeFactored(dst *quant.Tensor, row int, w []float32, src cuda.DevicePtr, n int, f *Factor, s quant.Scheme, opt Options) (*quant.Tensor, Stats, error) {
	solved, err := g.SolveFactored(dst, row, w, src, n, f, s, opt)
	if err != nil {
		return nil, Stats{}, err
	}
	return solved.Results()
}

// SolveFactored is QuantizeFactored up to the results: it returns once the weights are quantized
// on the device (and the baseline loss known), for DequantizeTo to follow at once, and leaves the
// codes and group parameters there until Results brings them down into dst. A calibration's next
// forward pass need not wait for that copy: it runs while Results does, from another goroutine.
// Results must be called; the solver's next use but DequantizeTo waits for it.
func (g *GPUSolver) SolveFactored(dst *quant.Tensor, row int, w []float32, src cuda.DevicePtr, n int, f *Factor, s quant.Scheme, opt Options) (*Solved, error) {
	g.settle()
	start := time.Now()
	if err := g.checkSolve(dst, row, w, src, n, f.k, s, opt); err != nil {
		return nil, err
	}
	solved, err := g.solveRows(dst, row, w, src, n, f, s, opt, start)
	if err != nil {
		return nil, err
	}
	solved.done = make(chan struct{})
	g.finishing = solved.done
	return solved, nil
}

// checkSolve checks a solve's weights (their shape only when they are on the device: run checks
// the copy there), scheme and options, and that its rows fit dst.
func (g *GPUSolver) checkSolve(dst *quant.Tensor, row int, w []float32, src cuda.DevicePtr, n, k int, s quant.Scheme, opt Options) error {
	if dst != nil && (dst.Scheme != s || dst.K != k || row < 0 || row+n > dst.N) {
		return fmt.Errorf("gptq: rows %d..%d of %s with %d columns do not fit a %d×%d %s tensor", row, row+n, s, k, dst.N, dst.K, dst.Scheme)
	}
	check := checkWeights
	if src != 0 {
		check = checkWeightShape
	}
	if err := check(w, n, k, s, opt); err != nil {
		return err
	}
	return g.supports(s, opt)
}

// solveRows puts rows [row, row+n) of dst (all of a new tensor when dst is nil) into place
// for solveFactored.
func (g *GPUSolver) solveRows(dst *quant.Tensor, row int, w []float32, src cuda.DevicePtr, n int, f *Factor, s quant.Scheme, opt Options, start time.Time) (*Solved, error) {
	if dst != nil {
		g.into = &rowsOf{dst, row}
		defer func() { g.into = nil }()
	}
	return g.solveFactored(w, src, n, f, s, opt, start)
}

// NewRowsTensor makes the n×k tensor of scheme s (an integer grid) that QuantizeGramRows calls fill.
func NewRowsTensor(s quant.Scheme, n, k int) *quant.Tensor { return newTensor(s, n, k, 0) }

// resultTensor is the tensor run fills: a new one, or rows of QuantizeGramRows's destination.
func (g *GPUSolver) resultTensor(p gpuPlan) *quant.Tensor {
	if g.into == nil {
		return newTensor(p.s, p.n, p.k, 0)
	}
	d, r, ng := g.into.dst, g.into.row, p.s.Groups(p.k)
	codes, params := d.Codes[r*p.k:(r+p.n)*p.k:(r+p.n)*p.k], [2]int{r * ng, (r + p.n) * ng}
	return &quant.Tensor{Scheme: p.s, N: p.n, K: p.k, Codes: codes,
		Scales: d.Scales[params[0]:params[1]:params[1]], Zeros: d.Zeros[params[0]:params[1]:params[1]]}
}

// loadGram makes H = scale·gram the factorisation's source (g.h: read in place, no copy) and
// returns its diagonal, checked finite.
func (g *GPUSolver) loadGram(gram cuda.DevicePtr, k int, scale float64) ([]float64, error) {
	g.h = hSource{gram: gram, scale: scale}
	d, err := g.buffer(slotBaseRows, 8*k)
	if err != nil {
		return nil, err
	}
	err = g.fn.gramDiagonal.Launch(cuda.Dim3{X: (k + 255) / 256, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream,
		gram, scale, int32(k), d)
	if err != nil {
		return nil, err
	}
	diag := make([]float64, k)
	if err := g.stager.CopyFromDevice(cuda.Bytes(diag), d, g.stream); err != nil {
		return nil, err
	}
	for i, v := range diag {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return nil, fmt.Errorf("gptq: Hessian diagonal entry %d is %g (non-finite activations?)", i, v)
		}
	}
	return diag, nil
}

// solveFactored runs GPTQ on the weights w (or their copy on the device at src) with factor f, up
// to the results, which it leaves to Solved.Results; start is when the caller began, for the
// times in the stats.
func (g *GPUSolver) solveFactored(w []float32, src cuda.DevicePtr, n int, f *Factor, s quant.Scheme, opt Options, start time.Time) (*Solved, error) {
	solved := &Solved{start: start}
	st := &solved.st
	*st = Stats{Damp: f.damp, Lambda: f.lambda, Retries: f.retries, FailedDamps: slices.Clone(f.failedDamps), Factor: f.elapsed}
	if err := f.usableBy(g, opt); err != nil {
		return solved, err
	}
	endPlan := g.mark("plan and weights")
	p, err := g.plan(n, f.k, f.diag, s, opt)
	if err == nil {
		if src == 0 {
			err = g.upload(slotOrig, cuda.Bytes(w))
		} else {
			err = g.copyResident(src, len(w))
		}
	}
	endPlan()
	if err != nil {
		return solved, err
	}
	st.Setup = time.Since(start)
	if solved.results, err = g.solvePlaced(p, f, st, src != 0); err != nil {
		return solved, err
	}
	return solved, nil
}

// Solved is a solve whose weights are quantized on the device and whose results are still
// there (SolveFactored).
type Solved struct {
	results func() (*quant.Tensor, error)
	st      Stats
	start   time.Time
	done    chan struct{} // closed when Results returns (SolveFactored's)
}

// Results brings the solve's codes and group parameters down into its tensor (a new one, or the
// rows of SolveFactored's dst) and checks them (non-finite weights, scales beyond F16, error
// feedback that diverged): the tensor and the stats, losses and times complete.
func (s *Solved) Results() (*quant.Tensor, Stats, error) {
	if s.done != nil {
		defer close(s.done)
	}
	t, err := s.results()
	if err != nil {
		return nil, s.st, err
	}
	s.st.Total = time.Since(s.start)
	return t, s.st, nil
}

// finished is the Results of a solve that may have failed.
func finished(s *Solved, err error) (*quant.Tensor, Stats, error) {
	if err != nil {
		return nil, s.st, err // (solveRows gives a Solved with its stats also on an error)
	}
	return s.Results()
}

// settle waits for the Results of the solver's last SolveFactored, which use its stream and
// buffers: every use of the solver but DequantizeTo begins with it.
func (g *GPUSolver) settle() {
	if g.finishing != nil {
		<-g.finishing
		g.finishing = nil
	}
}

// solvePlaced runs plan p with factor f on the weights in slotOrig (resident: an engine's copy,
// scanned for non-finite weights on the device), then the baseline loss when p's options ask for
// it, and returns how to bring the results down (their copies are queued after the baseline's work).
func (g *GPUSolver) solvePlaced(p gpuPlan, f *Factor, st *Stats, resident bool) (results func() (*quant.Tensor, error), err error) {
	g.resident = resident
	results, err = g.run(p, f, st)
	g.resident = false
	if err != nil || !p.opt.BaselineLoss {
		return results, err
	}
	defer g.mark("baseline loss")()
	start := time.Now()
	if st.Baseline, err = g.baseline(p, f); err != nil {
		return nil, err
	}
	st.BaselineTime = time.Since(start)
	return results, nil
}

// copyResident copies the weights on the device at src (count float32) into slotOrig.
func (g *GPUSolver) copyResident(src cuda.DevicePtr, count int) error {
	dst, err := g.buffer(slotOrig, 4*count)
	if err != nil {
		return err
	}
	return g.dev.CopyDeviceAsync(dst, src, 4*count, g.stream)
}

// usableBy checks that solver g may solve with f under options opt: made on g's GPU, still
// valid, for the same damping and column order.
func (f *Factor) usableBy(g *GPUSolver, opt Options) error {
	opt = opt.withDefaults()
	switch {
	case f.maker.dev != g.dev:
		return errors.New("gptq: the Hessian was factored on another GPU")
	case f.maker.generation != f.generation:
		return errors.New("gptq: the Hessian's factor is gone (its solver factored again or closed)")
	case opt.Damp != f.opt.Damp || opt.MaxDamp != f.opt.MaxDamp || opt.ActOrder != f.opt.ActOrder:
		return fmt.Errorf("gptq: the Hessian was factored with damping %g (max %g), act order %v; this solve asks %g (max %g), %v",
			f.opt.Damp, f.opt.MaxDamp, f.opt.ActOrder, opt.Damp, opt.MaxDamp, opt.ActOrder)
	}
	return nil
}

// baseline computes tr(W H Wᵀ) (quadraticForm: dead columns of W as zero) from the weights and
// Hessian already on the device, in the buffers the columns are done with: H rounded to
// float32, one TF32 GEMM W·H (the loss only reports how much GPTQ removed, and the CPU computes
// it in float32: a float64 GEMM took a sixth of a 7B down_proj's solve), a row-wise dot with W
// in float64, the rows summed on the host.
func (g *GPUSolver) baseline(p gpuPlan, f *Factor) (float64, error) {
	n, k := p.n, p.k
	w, h := g.bufs[slotW].ptr, f.h32 // N×K and K×K float32
	wh, err := g.buffer(slotBaseWH, 4*n*k)
	if err != nil {
		return 0, err
	}
	rows, err := g.buffer(slotBaseRows, 8*n)
	if err != nil {
		return 0, err
	}
	threads := cuda.Dim3{X: 256, Y: 1, Z: 1}
	err = g.fn.live.Launch(cuda.Dim3{X: (n*k + 255) / 256, Y: 1, Z: 1}, threads, 0, g.stream,
		g.bufs[slotOrig].ptr, g.bufs[slotDead].ptr, w, uint64(n*k), int32(k))
	if err == nil {
		err = g.blas.SetTF32(true)
	}
	if err != nil {
		return 0, err
	}
	// Row-major W·H is the column-major H·Wᵀ (H is symmetric).
	err = g.blas.Sgemm(cuda.NoTrans, cuda.NoTrans, k, n, k, 1, h, k, w, k, 0, wh, k)
	if e := g.blas.SetTF32(false); err == nil {
		err = e
	}
	if err != nil {
		return 0, err
	}
	err = g.fn.rowDot.Launch(cuda.Dim3{X: (n + 7) / 8, Y: 1, Z: 1}, threads, 0, g.stream, wh, w, int32(n), int32(k), rows)
	if err != nil {
		return 0, err
	}
	sums := make([]float64, n)
	if err := g.stager.CopyFromDevice(cuda.Bytes(sums), rows, g.stream); err != nil {
		return 0, err
	}
	var sum float64
	for _, v := range sums {
		sum += v
	}
	return sum, nil
}

// gpuPlan is what the host decides before the device works: the column order, the groups and
// the dead columns, all from diag H, and the group fit.
type gpuPlan struct {
	n, k      int
	s         quant.Scheme
	opt       Options
	dead      []bool
	deadCount int
	perm      []int
	lay       layout
	meanDiag  float64
	// search: groups are fitted by gptq_fit_search (Imatrix or Clip); impOrig and impPos are
	// the imatrix search's importance (importance), useFMA the Exp path of the clip search's
	// math.Pow (clipPowPath).
	search          bool
	impOrig, impPos []float32
	useFMA          bool
}

func (g *GPUSolver) plan(n, k int, diag []float64, s quant.Scheme, opt Options) (gpuPlan, error) {
	opt = opt.withDefaults()
	if len(diag) != k {
		// A caller passing the whole Hessian here once indexed past the column order.
		return gpuPlan{}, fmt.Errorf("gptq: %d diagonal entries for %d columns", len(diag), k)
	}
	if err := g.supports(s, opt); err != nil {
		return gpuPlan{}, err
	}
	if n > math.MaxInt32/32 || k > 1<<20 {
		return gpuPlan{}, fmt.Errorf("gptq: %dx%d is too large for the GPU path", n, k)
	}
	p := gpuPlan{n: n, k: k, s: s, opt: opt}
	p.dead, p.deadCount = deadColumns(diag)
	p.perm = columnOrder(diag, p.dead, opt.ActOrder)
	p.lay = newLayout(s, k, p.perm, opt.StaticGroups)
	p.search = opt.Imatrix || opt.Clip
	if opt.Imatrix {
		p.impOrig, p.impPos = importance(diag, p.dead, p.perm)
	} else if opt.Clip {
		p.useFMA, _ = clipPowPath()
	}
	for i := range k {
		p.meanDiag += diagFixed(diag[i], p.dead[i])
	}
	p.meanDiag /= float64(k)
	return p, nil
}

// buffer returns slot's device buffer, grown to at least bytes.
func (g *GPUSolver) buffer(slot, bytes int) (cuda.DevicePtr, error) {
	b := &g.bufs[slot]
	if bytes > b.size {
		if b.size > 0 {
			if err := g.dev.Free(b.ptr); err != nil {
				return 0, err
			}
			*b = gpuBuffer{}
		}
		size := (bytes + 255) / 256 * 256
		ptr, err := g.dev.Alloc(size)
		if err != nil {
			return 0, fmt.Errorf("gptq: %w", err)
		}
		*b = gpuBuffer{ptr: ptr, size: size}
	}
	return b.ptr, nil
}

// uploadWeights returns how to send w to slotOrig.
func (g *GPUSolver) uploadWeights(w []float32) func() error {
	return func() error { return g.upload(slotOrig, cuda.Bytes(w)) }
}

func (g *GPUSolver) upload(slot int, data []byte) error {
	ptr, err := g.buffer(slot, len(data))
	if err != nil {
		return err
	}
	return g.stager.CopyToDevice(ptr, data, g.stream)
}

func int32s(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// run quantizes the weights in slotOrig with factor f on the device and returns how to bring the
// results down (download).
func (g *GPUSolver) run(p gpuPlan, f *Factor, st *Stats) (results func() (*quant.Tensor, error), err error) {
	st.DeadColumns = p.deadCount
	ptr, err := g.allocate(p)
	if err != nil {
		return nil, err
	}
	ptr[slotT] = f.t
	if err := g.uploadPlan(p, ptr); err != nil {
		return nil, err
	}
	if g.resident {
		total := p.n * p.k
		err := g.fn.firstNonFinite.Launch(cuda.Dim3{X: (total + 255) / 256, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream,
			ptr[slotOrig], uint64(total), ptr[slotFlags].Add(flagNonFinite))
		if err != nil {
			return nil, err
		}
	}
	if err := g.columns(p, ptr); err != nil {
		return nil, err
	}
	g.solved = p
	t, row := g.resultTensor(p), 0
	if g.into != nil {
		row = g.into.row
	}
	return func() (*quant.Tensor, error) { return g.download(p, ptr, t, row, st) }, nil
}

// download brings the results of plan p from the buffers ptr into t (rows from row on, for the
// errors' row numbers), checks them and sets st's loss (relative to the baseline's, when p asks for it).
func (g *GPUSolver) download(p gpuPlan, ptr [numGPUSlots]cuda.DevicePtr, t *quant.Tensor, row int, st *Stats) (*quant.Tensor, error) {
	defer g.mark("results down")()
	n, groups := p.n, p.s.Groups(p.k)
	rowSq, rowDq := make([]float64, n), make([]float64, n)
	status := make([]byte, 32)
	for _, c := range []struct {
		dst []byte
		src cuda.DevicePtr
	}{
		{t.Codes, ptr[slotCodes]}, {cuda.Bytes(t.Scales), ptr[slotScales]}, {t.Zeros, ptr[slotZeros]},
		{cuda.Bytes(rowSq), ptr[slotRowSq]}, {cuda.Bytes(rowDq), ptr[slotRowDq]}, {status, ptr[slotFlags]},
	} {
		if err := g.stager.CopyFromDevice(c.dst, c.src, g.stream); err != nil {
			return nil, fmt.Errorf("gptq: %w", err)
		}
	}
	if at := binary.LittleEndian.Uint64(status[flagNonFinite:]); at != math.MaxUint64 {
		return nil, fmt.Errorf("gptq: weight at row %d, column %d is not finite", row+int(at)/p.k, int(at)%p.k)
	}
	if at := binary.LittleEndian.Uint64(status); at != math.MaxUint64 {
		r, gr := int(at)/groups, int(at)%groups
		return nil, fmt.Errorf("gptq: row %d, group %d: scale overflows F16", r, gr)
	}
	errSq, sqErr := 0.0, 0.0
	for r := range n {
		if math.IsNaN(rowSq[r]) || math.IsInf(rowSq[r], 0) {
			return nil, fmt.Errorf("gptq: row %d: the error feedback diverged (Hessian too ill-conditioned; raise the damping)", r)
		}
		errSq += rowSq[r]
		sqErr += rowDq[r]
	}
	t.GIdx = p.lay.gIdx()
	st.Loss = max(0, errSq-st.Lambda*sqErr)
	if p.opt.BaselineLoss { // solvePlaced computed the baseline before the results came down
		st.RelativeLoss = st.Loss / st.Baseline
	}
	return t, g.finishProfile()
}

// DequantizeTo writes the weights that the last solve quantized to, dequantized, as float32
// [N, K] (row-major) to dst on the solver's device: the values the returned tensor's Dequantize
// gives, bit for bit, without the trip through the host (a calibration engine's copy of the
// weights, replaced on the device). It returns once they are written.
func (g *GPUSolver) DequantizeTo(dst cuda.DevicePtr) error {
	p := g.solved
	if p.n == 0 {
		return errors.New("gptq: DequantizeTo before a solve")
	}
	defer g.mark("dequantize")()
	total := p.n * p.k
	err := g.fn.dequantize.Launch(cuda.Dim3{X: (total + 255) / 256, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream,
		g.bufs[slotCodes].ptr, g.bufs[slotScales].ptr, g.bufs[slotZeros].ptr, g.bufs[slotColGroup].ptr,
		int32(p.k), int32(p.s.Groups(p.k)), uint64(total), dst)
	if err != nil {
		return err
	}
	return g.dev.SynchronizeStream(g.stream)
}

// allocate grows every buffer to the problem and returns their addresses.
func (g *GPUSolver) allocate(p gpuPlan) ([numGPUSlots]cuda.DevicePtr, error) {
	n, k, ng := p.n, p.k, p.n*p.s.Groups(p.k)
	sizes := map[int]int{ // a solve's own buffers: the factorisation's may be read by other solves
		slotOrig: 4 * n * k, slotW: 4 * n * k, slotBaseWH: 4 * n * k,
		slotDiff: 4 * n * gpuBlockSize, slotCodes: n * k, slotScales: 4 * ng, slotZeros: ng,
		slotPerm: 4 * k, slotPosGroup: 4 * k, slotColGroup: 4 * k, slotDead: k,
		slotRowSq: 8 * n, slotRowDq: 8 * n, slotFlags: 32, slotImpOrig: 4 * k, slotImpPos: 4 * k,
	}
	var ptr [numGPUSlots]cuda.DevicePtr
	for slot, size := range sizes {
		var err error
		if ptr[slot], err = g.buffer(slot, size); err != nil {
			return ptr, err
		}
		if g.poison && slot != slotOrig {
			if err := g.dev.Fill32Async(ptr[slot], 0x7fc0dead, g.bufs[slot].size/4, g.stream); err != nil {
				return ptr, err
			}
		}
	}
	return ptr, nil
}

// uploadPlan copies the column order, groups and dead columns, and resets the accumulators.
func (g *GPUSolver) uploadPlan(p gpuPlan, ptr [numGPUSlots]cuda.DevicePtr) error {
	k := p.k
	posGroup, colGroup := make([]int, k), make([]int, k)
	dead := make([]byte, k)
	for i, c := range p.perm {
		posGroup[i] = p.lay.group(i)
		colGroup[c] = p.lay.group(i)
		if p.dead[c] {
			dead[c] = 1
		}
	}
	for _, u := range []struct {
		slot int
		data []byte
	}{
		{slotPerm, cuda.Bytes(int32s(p.perm))},
		{slotPosGroup, cuda.Bytes(int32s(posGroup))}, {slotColGroup, cuda.Bytes(int32s(colGroup))}, {slotDead, dead},
		{slotImpOrig, cuda.Bytes(p.impOrig)}, {slotImpPos, cuda.Bytes(p.impPos)}, // empty unless Imatrix
	} {
		if err := g.stager.CopyToDevice(ptr[u.slot], u.data, g.stream); err != nil {
			return fmt.Errorf("gptq: %w", err)
		}
	}
	if err := g.dev.Fill32Async(ptr[slotRowSq], 0, 2*p.n, g.stream); err != nil {
		return err
	}
	// status: no overflowing scale yet; no non-finite weight
	if err := g.dev.Fill32Async(ptr[slotFlags].Add(flagNonFinite), math.MaxUint32, 2, g.stream); err != nil {
		return err
	}
	return g.dev.Fill32Async(ptr[slotFlags], math.MaxUint32, 2, g.stream)
}

// columns quantizes block after block, then computes ‖W − Q‖² per row.
func (g *GPUSolver) columns(p gpuPlan, ptr [numGPUSlots]cuda.DevicePtr) error {
	n, k, groups, s := int32(p.n), int32(p.k), int32(p.s.Groups(p.k)), p.s
	threads := cuda.Dim3{X: 256, Y: 1, Z: 1}
	sym := int32(0)
	if s.Sym {
		sym = 1
	}
	phase := phaseOther // loading W, and fitting the groups that precede the column loop
	if p.search {
		phase = phaseFit
	}
	end := g.span(phase)
	err := g.fn.loadWeights.Launch(cuda.Dim3{X: (p.k + 255) / 256, Y: min(p.n, 65535), Z: 1}, threads, 0, g.stream,
		ptr[slotOrig], ptr[slotPerm], ptr[slotDead], n, k, ptr[slotW])
	fixed := p.lay.perChannel || p.lay.static
	if err == nil && fixed {
		gsize, zeroDead := int32(p.lay.size), int32(1)
		if p.lay.perChannel {
			zeroDead = 0
		}
		if p.search {
			// The search reads the rows as given (per-channel) or with dead columns zeroed
			// (static groups), in the original order, with diag H in that order.
			dead := ptr[slotDead]
			if zeroDead == 0 {
				dead = 0
			}
			err = g.fitSearch(p, ptr, ptr[slotOrig], dead, ptr[slotImpOrig], 0, int(groups))
		} else {
			jobs := p.n * int(groups)
			err = g.fn.fitFixed.Launch(cuda.Dim3{X: (jobs + 7) / 8, Y: 1, Z: 1}, threads, 0, g.stream, ptr[slotOrig], ptr[slotDead],
				n, k, gsize, groups, zeroDead, int32(s.Bits), sym, ptr[slotScales], ptr[slotZeros], ptr[slotFlags])
		}
	}
	end()
	if err != nil {
		return err
	}
	// On-the-fly groups are fitted min-max inside gptq_block, or searched by gptq_fit_search
	// just before it: either way from the weights settled from the block's first column (the
	// reference's find_params on the outer W), groups that start mid-block included. gptq_block
	// settles them itself where the groups starting in the block end in it (min-max fits of
	// groups that divide 128: the usual case); otherwise gptq_settle writes them first.
	settled := ptr[slotBaseWH]
	grid := cuda.Dim3{X: (p.n + gpuRowsPerCB - 1) / gpuRowsPerCB, Y: 1, Z: 1}
	for i1 := 0; i1 < p.k; i1 += gpuBlockSize {
		i2 := min(i1+gpuBlockSize, p.k)
		onTheFly := int32(0) // gptq_block's fits: none, from settled (1), settled in the kernel (2)
		if size := p.lay.size; !fixed {
			if first, next := (i1+size-1)/size, (i2+size-1)/size; next > first { // groups starting in [i1, i2)
				width := min(next*size, p.k) - i1
				switch {
				case !p.search && width <= i2-i1:
					onTheFly = 2
				case !p.search:
					onTheFly = 1
				}
				if onTheFly != 2 {
					end := g.span(phaseFit)
					err := g.fn.settle.Launch(grid, threads, 0, g.stream, ptr[slotW], ptr[slotT], ptr[slotOrig], ptr[slotDead], ptr[slotPerm],
						n, k, int32(i1), int32(width), settled)
					if err == nil && p.search {
						err = g.fitSearch(p, ptr, settled, 0, ptr[slotImpPos], first, next-first)
					}
					end()
					if err != nil {
						return err
					}
				}
			}
		}
		end := g.span(phaseColumns)
		err := g.fn.block.Launch(grid, threads, 0, g.stream, ptr[slotW], ptr[slotT], ptr[slotOrig], ptr[slotDead], n, k, int32(i1), int32(i2-i1),
			int32(s.Bits), sym, int32(p.lay.size), groups, onTheFly, settled, ptr[slotPosGroup], ptr[slotPerm],
			ptr[slotScales], ptr[slotZeros], ptr[slotCodes], ptr[slotDiff], ptr[slotRowSq], ptr[slotFlags])
		end()
		if err != nil {
			return err
		}
		if i2 == p.k {
			break
		}
		// Row-major W[N, K] is column-major K×N; W[:, i2:] += D·T′[i1:i2, i2:] is, column-major,
		// W[i2:, :] += T′[i1:i2, i2:]ᵀ (a (K−i2)×count view of T′ at ld K) · Dᵀ (count×N at ld 128).
		end = g.span(phaseGEMMs)
		err = g.blas.Sgemm(cuda.NoTrans, cuda.NoTrans, p.k-i2, p.n, i2-i1, 1, ptr[slotT].Add(4*(i1*p.k+i2)), p.k,
			ptr[slotDiff], gpuBlockSize, 1, ptr[slotW].Add(4*i2), p.k)
		end()
		if err != nil {
			return err
		}
	}
	end = g.span(phaseOther)
	err = g.fn.squaredError.Launch(cuda.Dim3{X: (p.n + 7) / 8, Y: 1, Z: 1}, threads, 0, g.stream, ptr[slotOrig], ptr[slotDead],
		ptr[slotCodes], ptr[slotScales], ptr[slotZeros], ptr[slotColGroup], n, k, groups, ptr[slotRowDq])
	end()
	if err != nil {
		return err
	}
	defer g.mark("wait for the columns")()
	return g.dev.SynchronizeStream(g.stream)
}

// fitSearch launches gptq_fit_search for groups first .. first+count−1 of every row of src
// (N×K, row-major): the imatrix search with importance imp, or the clip search. dead, when
// not 0, zeroes those columns' weights.
func (g *GPUSolver) fitSearch(p gpuPlan, ptr [numGPUSlots]cuda.DevicePtr, src, dead, imp cuda.DevicePtr, first, count int) error {
	weighted, useFMA, sym := int32(0), int32(0), int32(0)
	if p.opt.Imatrix {
		weighted = 1
	} else {
		imp = 0 // the clip search weighs every weight alike (the fitter passes no importance)
	}
	if p.useFMA {
		useFMA = 1
	}
	if p.s.Sym {
		sym = 1
	}
	const warps = 8 // per block of 256 threads
	jobs := p.n * count
	return g.fn.fitSearch.Launch(cuda.Dim3{X: (jobs + warps - 1) / warps, Y: 1, Z: 1}, cuda.Dim3{X: 32 * warps, Y: 1, Z: 1}, 0, g.stream,
		src, dead, imp, int32(p.n), int32(p.k), int32(p.lay.size), int32(p.s.Groups(p.k)), int32(first), int32(count),
		weighted, useFMA, int32(p.s.Bits), sym, ptr[slotScales], ptr[slotZeros], ptr[slotFlags])
}

// mark begins a timeline span of the solve's host-side steps on the solver's GPU lane.
func (g *GPUSolver) mark(name string) (end func()) {
	return timeline.Begin(g.dev.Info().Ordinal, "%s", name)
}

// span starts timing a phase (one of gpuProfile's fields) when profiling and returns the
// function that ends it.
func (g *GPUSolver) span(phase int) func() {
	if g.profile == nil {
		return func() {}
	}
	start, err1 := g.dev.NewEvent()
	end, err2 := g.dev.NewEvent()
	if err1 != nil || err2 != nil || g.dev.Record(start, g.stream) != nil {
		return func() {}
	}
	return func() {
		if g.dev.Record(end, g.stream) == nil {
			g.profile.pending = append(g.profile.pending, pendingSpan{phase, start, end})
		}
	}
}

// finishProfile adds the recorded spans to the profile and frees their events.
func (g *GPUSolver) finishProfile() error {
	if g.profile == nil {
		return nil
	}
	var errs []error
	for _, s := range g.profile.pending {
		d, err := g.dev.Elapsed(s.start, s.end)
		errs = append(errs, err, g.dev.DestroyEvent(s.start), g.dev.DestroyEvent(s.end))
		g.profile.phases[s.phase] += d
	}
	g.profile.pending = g.profile.pending[:0]
	return errors.Join(errs...)
}
