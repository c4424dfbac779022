package convert

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/gptq"
	"github.com/qpack-dev/qpack/internal/timeline"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"golang.org/x/sync/errgroup"
)

// GPTQOptions are the GPTQ variant's settings (`--method gptq`).
type GPTQOptions struct {
	Damp           float64 // relative damping (default 0.01), raised ×10 when H will not factor
	ActOrder       bool    // desc_act: quantize columns by decreasing diag H
	StaticGroups   bool    // fit group parameters before any update (keeps g_idx trivial with act-order)
	TrueSequential bool    // quantize q/k/v, then o, then gate/up, then down, each seeing the earlier ones quantized
}

// gptqResult is one module's GPTQ output, delivered to the writer when its block is done.
type gptqResult struct {
	t      *quant.Tensor
	values []float32 // a kept tensor that AWQ's folding changed, instead of t
	stats  gptq.Stats
	err    error
}

// blockRunner carries out the methods that calibrate (GPTQ, AWQ, awq+gptq): it runs the model
// block by block over the calibration data, quantizes each block's planned linears (GPTQ's
// solver, or AWQ's scaler and clipped rounding) and hands each result to the writer, which
// streams the output while later blocks are still running. Linears that share an input share
// one Hessian.
type blockRunner struct {
	opt     gptq.Options
	solver  solverSet      // nil: the pure-Go solver; else the first of all (for Supports)
	solvers chan solverSet // the free ones of all
	sets    int            // how many solvers holds (those made), once warming is done
	all     []solverSet
	// moreSolvers makes the solver sets after the first in the background (useGPUs)
	moreSolvers   sync.WaitGroup
	solversClosed sync.Once
	// warm, when set, warms the solver sets made before they are handed out (warmer); warming
	// is that and the handing out, which Update waits for
	warm      func([]solverSet)
	warming   sync.WaitGroup
	warmShape warmShape // the most common planned linear
	tensors   tensorsAhead
	// lastBlock is the model's last block (set by run), whose first Update returns the heap's free
	// memory to the system, once (memoryReturned)
	lastBlock      int
	memoryReturned sync.Once
	// ahead makes the calibration engines in the background (startEngines); nil once taken
	ahead   *enginesAhead
	dev     *cuda.Device   // nil: the forward passes and Hessians on the CPU; else the first GPU
	devs    []*cuda.Device // every GPU calibrating (GPTQ; AWQ's scaler works on the first)
	gpu     *gpuCapture    // while calibrating on the GPU
	device  string
	schemes map[string]quant.Scheme // module prefix → planned scheme
	globals map[string]float32      // NVFP4 modules' shared global scales (Options.globals)
	hess    map[string]*gptq.Hessian
	method  Method
	logf    func(string, ...any)
	stopped atomic.Bool
	ctx     context.Context  // the conversion's: result stops waiting when it is done
	awq     *awqScaler       // set for --method awq and awq+gptq: it drives the calibration
	gpuPeak uint64           // the most GPU memory in use during a calibration on the GPU
	experts *expertRouting   // which experts are calibrated on which tokens
	tokens  int              // calibration tokens, for the experts' log lines
	math    model.GPUOptions // the GPU engine's GEMM math (Options.CalibMath)
	setup   time.Duration    // making the GPU solvers and calibration engines
	// calibrating is when the calibration's first pass began (set before it starts: read by
	// phases once the conversion has waited for the runner)
	calibrating time.Time
	solving     atomic.Int64 // nanoseconds in updateGroup's solves and weight replacements (the rest of Update is Hessian handling)
	onGPU       bool         // during an Update: the solved weights replace the engines' copies on the GPUs (replacesOnGPU)
	// delivering brings solved linears' results down from the GPUs and hands them to the writer
	// while the calibration goes on (deliver); undelivered is the first error met there
	delivering  sync.WaitGroup
	undelivered error

	mu      sync.Mutex
	results map[string]chan gptqResult
}

// newBlockRunner makes the runner of a method that calibrates, for the planned items: it checks
// each one against the method before any calibration (Method.Takes, and GPTQ's row lengths).
func newBlockRunner(opt Options, items []Item, logf func(string, ...any)) (*blockRunner, error) {
	r := &blockRunner{method: opt.Method, schemes: map[string]quant.Scheme{}, hess: map[string]*gptq.Hessian{}, logf: logf,
		results: map[string]chan gptqResult{}, ctx: opt.context(), opt: opt.gptq(), globals: opt.globals,
		experts: newExpertRouting(opt.Experts, logf)}
	var err error
	if r.math, err = calibEngineOptions(opt.CalibMath); err != nil {
		return nil, err
	}
	for _, it := range items {
		if it.Scheme == nil {
			continue
		}
		if it.Role == model.RoleEmbedding || it.Role == model.RoleClassifier || it.Info.Shape[0] <= 0 {
			return nil, fmt.Errorf("tensor %s: %s quantizes decoder linears only; keep it (drop --quantize-embeddings/--quantize-head) or use --method rtn", it.Info.Name, opt.Method)
		}
		if err := opt.Method.Takes(*it.Scheme, opt); err != nil {
			return nil, fmt.Errorf("tensor %s: %w", it.Info.Name, err)
		}
		if err := gptq.CheckScheme(*it.Scheme, it.K(), r.opt); opt.Method.Solves() && err != nil {
			return nil, fmt.Errorf("tensor %s: %w", it.Info.Name, err)
		}
		r.schemes[it.Module] = *it.Scheme
		r.results[it.Module] = make(chan gptqResult, 1)
	}
	r.warmShape = mostCommonShape(items)
	return r, nil
}

// warmShape is a planned linear's scheme and shape (out × in), with how many linears have it.
type warmShape struct {
	s       quant.Scheme
	n, k    int
	linears int
}

// mostCommonShape is the scheme and shape that the most planned linears of items share (the
// first of them in items' order on a tie); linears 0 when no item is planned.
func mostCommonShape(items []Item) warmShape {
	counts := map[warmShape]int{}
	var best warmShape
	for _, it := range items {
		if it.Scheme == nil {
			continue
		}
		key := warmShape{s: *it.Scheme, n: it.Info.Shape[0], k: it.K()}
		counts[key]++
		if counts[key] > best.linears {
			best, best.linears = key, counts[key]
		}
	}
	return best
}

// result waits for a module's quantized tensor, or until the conversion is stopped (a unit
// waiting here would otherwise hold a stopped conversion until GPTQ reached its layer).
func (r *blockRunner) result(module string) (*quant.Tensor, error) {
	select {
	case res := <-r.results[module]:
		return res.t, res.err
	case <-r.ctx.Done():
		return nil, r.ctx.Err()
	}
}

// value waits for a kept tensor that the calibration run changed (AWQ's folded scales).
func (r *blockRunner) value(name string) ([]float32, error) {
	res := <-r.results[name]
	return res.values, res.err
}

// fail delivers err to every module still waiting.
func (r *blockRunner) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for m, ch := range r.results {
		select {
		case ch <- gptqResult{err: fmt.Errorf("%s did not reach %s: %w", r.method, m, err)}:
		default:
		}
	}
}

// run calibrates the model over the sequences, quantizing as it goes.
func (r *blockRunner) run(opening *modelOpening, calib *Calibration, trueSequential bool) {
	endOpen := timeline.Begin(timeline.Host, "wait for the model")
	m, err := opening.take()
	endOpen()
	if err == nil {
		defer func() {
			defer timeline.Begin(timeline.Host, "close the model")()
			m.Close()
		}()
		r.tokens = calib.Samples * calib.SeqLen
		r.lastBlock = m.Config.Layers - 1
		r.tensors.last = r.lastBlock
		opt := model.CalibrateOptions{TrueSequential: trueSequential, ReleaseBlocks: true, Experts: r.experts.observation(),
			RecycleBlocks: r.awq == nil} // GPTQ's runner keeps none of a block's slices past its Update (AWQ hands some to the writer)
		if r.awq != nil {
			err = r.awq.calibrate(m, calib.seqs, opt)
		} else if r.dev != nil {
			err = r.calibrateOnGPU(m, calib.seqs, r, opt)
		} else {
			r.calibrating = time.Now()
			err = model.Calibrate(m, calib.seqs, r, opt)
		}
	}
	r.delivering.Wait()
	if err == nil {
		err = r.deliveryError()
	}
	if err != nil {
		r.fail(err)
	}
}

// modelOpening is the model a calibration runs, opened in the background while the conversion
// sets up (its GPUs' contexts and solvers take a second or two).
type modelOpening struct {
	done chan struct{}
	m    *model.Model
	cfg  *model.Config // m's, also once m is taken
	err  error
}

// openModel starts opening the model in dir, when the method calibrates (nil otherwise).
func openModel(dir string, method Method) *modelOpening {
	if !method.Calibrates() {
		return nil
	}
	o := &modelOpening{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		if o.m, o.err = model.Open(dir); o.err == nil {
			o.cfg = o.m.Config
			o.m.Prefetch(0) // while the GPUs are set up
		}
	}()
	return o
}

// config waits for the model and returns its configuration (the model stays for take).
func (o *modelOpening) config() (*model.Config, error) {
	<-o.done
	return o.cfg, o.err
}

// take waits for the model and hands it to the caller, who closes it.
func (o *modelOpening) take() (*model.Model, error) {
	<-o.done
	m := o.m
	o.m = nil
	return m, o.err
}

// discard closes the model if no calibration took it (the conversion failed first).
func (o *modelOpening) discard() {
	if o == nil {
		return
	}
	if m, _ := o.take(); m != nil {
		m.Close()
	}
}

// phases are the calibration's lines of the time breakdown: when its first pass began, counted
// from start (the conversion's), and AWQ's parts.
func (r *blockRunner) phases(start time.Time) []Phase {
	if r == nil {
		return nil
	}
	var p []Phase
	if !r.calibrating.IsZero() {
		p = append(p, newPhase("calibration began", r.calibrating.Sub(start).Seconds(), 0))
	}
	return append(p, r.awqPhases()...)
}

// start runs the calibration in the background; the returned function stops it at its next
// step (when the writer has finished or failed) and waits for it. A nil runner does nothing.
func (r *blockRunner) start(opening *modelOpening, calib *Calibration, trueSequential bool) (stop func()) {
	if r == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(opening, calib, trueSequential)
	}()
	return func() {
		r.stopped.Store(true)
		<-done
	}
}

func (r *blockRunner) Observe(block int, g model.Group, x []float32, rows, cols int) error {
	if r.stopped.Load() {
		return fmt.Errorf("stopped")
	}
	key := hessianKey(block, g)
	h := r.hess[key]
	if h == nil {
		h = gptq.NewHessian(cols)
		r.hess[key] = h
		r.experts.start(block, g)
	}
	r.experts.add(block, g, rows)
	if rows == 0 { // an expert no token of this sequence was routed to
		return nil
	}
	if err := h.Add(x, rows, cols); err != nil {
		return fmt.Errorf("block %d, input of %s: %w", block, g, err)
	}
	return nil
}

// Update quantizes each planned linear of the groups with its group's Hessian and puts the
// dequantized weights back, so the next groups and blocks see the quantization error. The
// gate/up of an expert calibrated on every token use GroupGateUp's Hessian (expertRouting).
func (r *blockRunner) Update(b *model.Block, groups []model.Group) error {
	if r.gpu != nil {
		defer func(start time.Time) { r.gpu.solve += time.Since(start) }(time.Now())
	}
	r.warming.Wait() // the first solver set's warm-up
	if err := r.deliveryError(); err != nil {
		return err
	}
	if b.Index == r.lastBlock && b.Index > 0 { // (lastBlock is 0 until run sets it: a runner Update is called on directly, in tests)
		r.memoryReturned.Do(returnFreeMemory)
	}
	defer timeline.Begin(timeline.Host, "solve block %d %v", b.Index, groups)()
	sources := make([]model.Group, len(groups))
	for i, g := range groups {
		sources[i] = r.experts.source(b.Index, g)
		if _, ok := g.Expert(); ok {
			r.experts.report(r.method.String(), b, r.tokens)
		}
	}
	r.onGPU = r.replacesOnGPU(b, groups)
	planned := func(l *model.Linear) (quant.Scheme, bool) {
		s, ok := r.schemes[l.Name]
		return s, ok && r.solver.first().Supports(s, r.opt)
	}
	aheadTensors := r.onGPU && b.MoE == nil // (a block of experts would make hundreds of them at once)
	if aheadTensors {
		r.tensors.start(b, planned)
	}
	bundles := bundlesOf(sources)
	solve := r.solveBundles
	if r.spreads(b, bundles) {
		solve = r.solveSpread
	}
	if err := solve(b, groups, sources, bundles); err != nil {
		return err
	}
	for _, g := range groups { // the routed Hessians of experts calibrated on every token
		if src := r.experts.source(b.Index, g); src != g {
			r.dropHessian(b.Index, g)
		}
	}
	if aheadTensors {
		r.tensors.next(b, groups, planned)
	}
	if r.onGPU {
		return r.gpu.keepDeviceWeights()
	}
	return nil
}

// bundlesOf groups the indices of an update's groups by their source Hessian (the gate/up of
// experts calibrated on every token share GroupGateUp's), in the order of each source's first
// group: on the GPU a Hessian is factored once for all its groups, and its factor lasts only
// until its solver factors another, so they are solved one after the other.
func bundlesOf(sources []model.Group) [][]int {
	var bundles [][]int
	at := map[model.Group]int{}
	for i, src := range sources {
		j, ok := at[src]
		if !ok {
			j = len(bundles)
			at[src] = j
			bundles = append(bundles, nil)
		}
		bundles[j] = append(bundles[j], i)
	}
	return bundles
}

// solveBundles solves an update's bundles one after another, every linear's rows shared among
// the GPUs, each bundle's Hessian freed as soon as its groups are solved.
func (r *blockRunner) solveBundles(b *model.Block, groups, sources []model.Group, bundles [][]int) error {
	for _, bundle := range bundles {
		solve, release, err := r.hessianOf(b.Index, sources[bundle[0]])
		if err != nil {
			return err
		}
		err = r.solveBundle(b, groups, bundle, solve, r.pool())
		release()
		if err != nil {
			return err
		}
	}
	return nil
}

// solveBundle solves the groups of a bundle with its Hessian's solve and the solvers of pool.
func (r *blockRunner) solveBundle(b *model.Block, groups []model.Group, bundle []int, solve solveFunc, pool solverPool) error {
	for _, i := range bundle {
		if err := r.updateGroup(b, groups[i], solve, pool); err != nil {
			return err
		}
	}
	return nil
}

// dropHessian frees the Hessian gathered for group g of block, when another group's is used.
func (r *blockRunner) dropHessian(block int, g model.Group) {
	key := hessianKey(block, g)
	if r.gpu != nil {
		for i, sh := range r.gpu.shards {
			if gr := sh.grams[key]; gr != nil {
				delete(sh.grams, key)
				r.gpu.keep(i, gr)
			}
		}
		return
	}
	delete(r.hess, key)
}

// solveFunc runs GPTQ on one linear with its group's Hessian; global is an NVFP4 linear's
// shared global scale (0: its own). set holds the GPU solvers to use (nil on the CPU). It returns
// once the linear is solved (and, with r.onGPU, its weights replaced on the GPUs), with how to get
// its results, which may still be on the GPUs: they must be got, once.
type solveFunc func(l *model.Linear, s quant.Scheme, global float32, set solverSet) (solveResults, error)

// solveResults gives a solved linear's tensor and stats.
type solveResults func() (*quant.Tensor, gptq.Stats, error)

// solvedNow is a solve's results that are at hand already.
func solvedNow(t *quant.Tensor, st gptq.Stats, err error) (solveResults, error) {
	if err != nil {
		return nil, err
	}
	return func() (*quant.Tensor, gptq.Stats, error) { return t, st, nil }, nil
}

// solverSet is a GPTQ solver on each GPU of the runner, in its order, or nil where a GPU takes
// no share: a linear's rows are shared among its solvers (solveRows).
type solverSet []*gptq.GPUSolver

// first is the set's first solver, or nil on the CPU.
func (s solverSet) first() *gptq.GPUSolver {
	for _, g := range s {
		if g != nil {
			return g
		}
	}
	return nil
}

// shards lists the GPUs (their indices among the runner's) that have a solver in the set.
func (s solverSet) shards() []int {
	var on []int
	for i, g := range s {
		if g != nil {
			on = append(on, i)
		}
	}
	return on
}

// on is the set with GPU d's solver alone.
func (s solverSet) on(d int) solverSet {
	one := make(solverSet, len(s))
	one[d] = s[d]
	return one
}

// solverPool is where an update's linears get their solvers: first solves them one after
// another, the sets of free (nil on the CPU) solve several at once (parallelSolves); sets is how
// many free holds when none is taken.
type solverPool struct {
	first solverSet
	free  chan solverSet
	sets  int
}

// pool is every GPU's solvers: a linear's rows shared among the GPUs.
func (r *blockRunner) pool() solverPool { return solverPool{r.solver, r.solvers, r.sets} }

// hessianOf returns how to solve with the Hessian of group g of block: on the host, or on the
// GPU from the Gram matrix gathered there (gpuSolveFunc).
func (r *blockRunner) hessianOf(block int, g model.Group) (solveFunc, func(), error) {
	if r.gpu != nil {
		return r.gpuSolveFunc(block, g)
	}
	key := hessianKey(block, g)
	h := r.hess[key]
	if h == nil || h.N == 0 {
		return nil, nil, fmt.Errorf("block %d: no calibration inputs reached %s", block, g)
	}
	delete(r.hess, key)
	hm := h.Matrix() // mirrored once, before the group's solves read it at once
	solve := func(l *model.Linear, s quant.Scheme, global float32, set solverSet) (solveResults, error) {
		return solvedNow(r.quantize(l.W, l.Out, l.In, hm, s, global, set.first()))
	}
	return solve, func() {}, nil
}

// updateGroup quantizes the planned linears of group g and puts their dequantized weights back.
// The linears of a group share its Hessian and nothing else, so with a GPU they are solved at
// once by gpuSolvers solvers on streams of their own where their buffers are small
// (parallelSolves: q, k and v's solves each leave the GPU mostly idle; on the CPU one solve
// already takes every core); results are used in the group's order.
func (r *blockRunner) updateGroup(b *model.Block, g model.Group, solve solveFunc, pool solverPool) error {
	var work []*solvedLinear
	for _, l := range b.Linears(g) {
		if s, planned := r.schemes[l.Name]; planned {
			work = append(work, &solvedLinear{l: l, s: s})
		}
	}
	// Each linear's dequantized weights replace its own (in place: W is no longer needed) as soon
	// as it is solved, while the others' solves go on: on the GPUs (r.onGPU), or the host's copy,
	// which needs the results now.
	solveAndReplace := func(x *solvedLinear, set solverSet) {
		x.results, x.err = solve(x.l, x.s, r.globals[x.l.Name], set)
		if x.err != nil || r.onGPU {
			return
		}
		if t := x.bringDown(); x.err == nil {
			x.err = x.l.SetWeight(t.Dequantize(x.l.W))
		}
	}
	start := time.Now()
	// A solver's next solve waits until the results of its last have come down (gptq's
	// SolveFactored), and they come down once the whole group is solved (deliver): a set may
	// solve one linear of a group, or the results must be brought down before it solves another.
	if len(work) > 1 && r.parallelSolves(work[0].l.In) && len(work) <= pool.sets {
		var wg sync.WaitGroup
		for _, x := range work {
			set := <-pool.free
			wg.Go(func() {
				defer func() { pool.free <- set }() // its next use waits for the results (gptq.GPUSolver.SolveFactored)
				solveAndReplace(x, set)
			})
		}
		wg.Wait()
	} else {
		for i, x := range work {
			solveAndReplace(x, pool.first)
			if x.err == nil && r.onGPU && i+1 < len(work) { // (on the host they came down already)
				x.bringDown()
			}
		}
	}
	r.solving.Add(int64(time.Since(start)))
	var err error
	for _, x := range work {
		if x.err != nil {
			err = fmt.Errorf("tensor %s.weight: %w", x.l.Name, x.err)
			break
		}
	}
	r.delivering.Go(func() { r.deliver(work) }) // also after an error: the solved ones' results free their solvers
	return err
}

// solvedLinear is a linear of a group being updated.
type solvedLinear struct {
	l       *model.Linear
	s       quant.Scheme
	results solveResults // nil when the solve failed
	t       *quant.Tensor
	st      gptq.Stats
	err     error
}

// bringDown gets the results of x's solve now (x.err set where it failed) and keeps them for
// deliver; it returns the tensor.
func (x *solvedLinear) bringDown() *quant.Tensor {
	t, st, err := x.results()
	x.results, x.err = solvedNow(t, st, err)
	return t
}

// deliver gets the results of a group's solved linears, which the GPUs bring down while the next
// forward pass runs (the codes of a 7B block take a few milliseconds a linear), and hands them to
// the writer; the first error is kept for Update and the calibration's end to report.
func (r *blockRunner) deliver(work []*solvedLinear) {
	for _, x := range work {
		if x.err == nil {
			x.t, x.st, x.err = x.results()
		}
	}
	for _, x := range work {
		l := x.l
		if x.err != nil {
			err := fmt.Errorf("tensor %s.weight: %w", l.Name, x.err)
			r.hand(l.Name, gptqResult{err: err})
			r.mu.Lock()
			if r.undelivered == nil {
				r.undelivered = err
			}
			r.mu.Unlock()
			return
		}
		r.logf("gptq %s %s on %s: relative loss %.5f, damping %g (%d retries), %s\n",
			l.Name, x.s, r.deviceFor(x.s), x.st.RelativeLoss, x.st.Damp, x.st.Retries, solveTimes(x.st))
		r.hand(l.Name, gptqResult{t: x.t, stats: x.st})
	}
}

// hand gives the writer a module's result, unless it has one already: the error of a calibration
// that failed meanwhile (fail).
func (r *blockRunner) hand(module string, res gptqResult) {
	select {
	case r.results[module] <- res:
	default:
	}
}

// deliveryError is the first error met in bringing results down (deliver).
func (r *blockRunner) deliveryError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.undelivered
}

// gpuSolvers is how many GPTQ solvers (each with its stream and buffers) the runner keeps on a GPU.
const gpuSolvers = 3

// parallelSolves says whether a group whose Hessians are k×k is solved by every solver at once:
// when their k²-sized buffers (16·k² bytes each: H's factor in float64, H and T′ in float32;
// 28·k² counted, as when H and an inverse were kept too) take at most an eighth of the GPU's
// memory together. Other
// groups (down_proj's Hessian of a 70B model alone is 23 GB) are solved one linear after
// another by the first solver, so that only it grows to their size.
func (r *blockRunner) parallelSolves(k int) bool {
	return r.solvers != nil && gptqParallelSolves && gpuSolvers*28*uint64(k)*uint64(k) <= r.dev.Info().TotalMemory/8
}

// gptqParallelSolves lets a group's linears be solved at once (parallelSolves); tests turn it
// off to solve a small model's groups as those of a model with Hessians too wide are.
var gptqParallelSolves = true

// returnFreeMemory gives the heap's free memory back to the system in the background. Called as
// the last block calibrates, when the blocks before it are released (model.RecycleBlock): a 7B's
// conversion ends with about 4 GB of heap, which the process's exit would otherwise give back
// after the output is written (0.26 s of a conversion's 10–17 s on an H200 host).
func returnFreeMemory() {
	free := freeOSMemory // read now: a test replaces it between conversions
	go func() {
		defer timeline.Begin(timeline.Host, "return free memory to the system")()
		free()
	}()
}

var freeOSMemory = debug.FreeOSMemory // (tests count the calls)

// useGPU makes the runner calibrate and solve on the GPUs: the forward passes and Hessians
// (gpuCapture), the column loop, factorisations and group fits, searched ones (the clip search,
// --imatrix) included (gptq.GPUSolver). What the solver does not take (NF4, k-quants; clip search where the GPU
// cannot reproduce the CPU's math.Pow) is solved on the CPU with the Hessians gathered on the
// GPUs.
func (r *blockRunner) useGPU(g *gpu, opening *modelOpening) error {
	if g == nil {
		r.device = DeviceCPU
		return nil
	}
	if opening != nil {
		r.ahead = r.startEngines(g.devs, opening)
	}
	if r.method.Solves() && r.warmShape.linears > 0 {
		r.warm = r.warmer(len(g.devs))
	}
	return r.useGPUs(g.devs)
}

// useGPUs is useGPU on the GPUs given (the first is the one everything but GPTQ's row shares
// runs on).
func (r *blockRunner) useGPUs(devs []*cuda.Device) error {
	defer func(start time.Time) { r.setup += time.Since(start) }(time.Now())
	r.solvers = make(chan solverSet, gpuSolvers)
	r.all = make([]solverSet, gpuSolvers)
	for i := range r.all {
		r.all[i] = make(solverSet, len(devs))
	}
	r.devs = devs // close closes the solvers made, also after an error
	if err := r.makeSolverSet(0); err != nil {
		return err
	}
	r.solver, r.dev, r.device = r.all[0], devs[0], DeviceCUDA
	// The others (q, k and v solved at once) are made, then all are warmed, while the
	// calibration begins: a solver's cuBLAS and cuSOLVER handles take a while, and so do the
	// first factorisation and solve.
	made := 1
	r.moreSolvers.Go(func() {
		errs := make([]error, len(r.all))
		var making sync.WaitGroup
		for i := 1; i < len(r.all); i++ {
			making.Go(func() { errs[i] = r.makeSolverSet(i) })
		}
		making.Wait()
		for ; made < len(r.all); made++ { // the sets up to the first that failed (closeSolvers closes all)
			if errs[made] != nil {
				r.logf("GPTQ solvers: %v (fewer linears are solved at once)\n", errs[made])
				return
			}
		}
	})
	r.warming.Go(func() {
		r.moreSolvers.Wait()
		if r.warm != nil {
			r.warm(r.all[:made])
		}
		r.sets = made
		for _, set := range r.all[:made] {
			r.solvers <- set
		}
	})
	return nil
}

// makeSolverSet makes solver set i, a solver on each GPU at once.
func (r *blockRunner) makeSolverSet(i int) error {
	var making errgroup.Group
	for d, dev := range r.devs {
		making.Go(func() (err error) {
			defer timeline.Begin(dev.Info().Ordinal, "GPTQ solver %d", i)()
			r.all[i][d], err = gptq.NewGPUSolver(dev)
			return err
		})
	}
	return making.Wait()
}

// deviceFor names where GPTQ solves a tensor of scheme s.
func (r *blockRunner) deviceFor(s quant.Scheme) string {
	if r.solver != nil && !r.solver[0].Supports(s, r.opt) {
		return "cpu (Hessians on cuda)"
	}
	return r.device
}

func (r *blockRunner) quantize(w []float32, n, k int, h []float64, s quant.Scheme, global float32, g *gptq.GPUSolver) (*quant.Tensor, gptq.Stats, error) {
	if g != nil && g.Supports(s, r.opt) {
		return g.Quantize(w, n, k, h, s, r.opt)
	}
	return gptq.Quantize(w, n, k, h, s, r.optFor(global))
}

// optFor is the solver's options with an NVFP4 linear's global scale.
func (r *blockRunner) optFor(global float32) gptq.Options {
	opt := r.opt
	opt.GlobalScale = global
	return opt
}

func (r *blockRunner) close() {
	if r == nil {
		return
	}
	r.dropEngines()
	r.closeSolvers()
	if r.awq != nil {
		r.awq.close()
	}
}

// closeSolvers closes the GPTQ solvers made, once: at the end of a GPU calibration that
// succeeded (while the writer finishes), else when the runner closes.
func (r *blockRunner) closeSolvers() {
	r.solversClosed.Do(func() {
		defer timeline.Begin(timeline.Host, "close the solvers")()
		r.warming.Wait()
		r.moreSolvers.Wait()
		var closing sync.WaitGroup // each GPU's solvers at once: freeing device and pinned memory waits on the GPU
		for d := range r.devs {
			closing.Go(func() {
				for _, set := range r.all {
					if set[d] != nil { // useGPUs failed before making it
						set[d].Close()
					}
				}
			})
		}
		closing.Wait()
	})
}

// solveTimes formats a quantization's time, with its parts on the GPU.
func solveTimes(st gptq.Stats) string {
	ms := func(d time.Duration) float64 { return 1000 * d.Seconds() }
	if st.Setup == 0 {
		return fmt.Sprintf("%.0fms", ms(st.Total))
	}
	return fmt.Sprintf("%.0fms (setup %.0f, factor %.0f, baseline loss %.0f)", ms(st.Total), ms(st.Setup), ms(st.Factor), ms(st.BaselineTime))
}
