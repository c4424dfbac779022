package convert

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/gptq"
	"github.com/qpack-dev/qpack/internal/shares"
	"github.com/qpack-dev/qpack/internal/timeline"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"golang.org/x/sync/errgroup"
)

// gpuCapture is the GPU side of a GPTQ calibration: the forward passes run on the GPUs
// (model.GPU, one engine per GPU, each over its share of the sequences) and each linear group's
// Gram matrix Σ xᵀx accumulates there in float32, one partial sum per GPU, summed where the
// solvers read it (gpuSolveFunc).
type gpuCapture struct {
	shards []*gpuShard   // one per GPU calibrating
	upper  bool          // sumShards adds the upper triangles in place (sumsUpper, decided with the shards)
	sums   time.Duration // spent in sumShards
	mu     sync.Mutex    // the shards' Gram maps and expert counts while the engines observe
	solve  time.Duration
}

// gpuShard is one GPU's part of a calibration.
type gpuShard struct {
	e     *model.GPU
	grams map[string]*deviceGram
	spare map[int][]cuda.DevicePtr // k×k Gram buffers whose groups were solved, by k, for the next ones
	band  cuda.DeviceBuffer        // sumShards: the shard's band of the summed Gram matrix
	peer  cuda.DeviceBuffer        // sumShards: another GPU's part of that band
}

// newGram returns a k×k float32 buffer for a Gram matrix: a spare one, or a new one. Reusing
// them keeps cuMemFree, which waits for all the device's work, out of every step (under c.mu).
func (sh *gpuShard) newGram(k int) (cuda.DevicePtr, error) {
	if free := sh.spare[k]; len(free) > 0 {
		sh.spare[k] = free[:len(free)-1]
		return free[len(free)-1], nil
	}
	return sh.e.Device().Alloc(4 * k * k)
}

type deviceGram struct {
	sum  cuda.DevicePtr // k×k float32
	k, n int            // width, rows accumulated
}

// calibrateOnGPU runs the calibration through the GPU forward pass with cal observing (the
// runner itself for GPTQ, its AWQ scaler for AWQ) on every GPU it has (data-parallel:
// model.CalibrateSharded; with experts, the tokens routed to each are counted over all the GPUs).
func (r *blockRunner) calibrateOnGPU(m *model.Model, seqs [][]int, cal shardedCalibrator, opt model.CalibrateOptions) error {
	devs := r.devs[:min(len(r.devs), len(seqs))]
	r.gpu = &gpuCapture{}
	defer r.gpu.free()
	engines, err := r.engines(devs, m.Config)
	defer closeEngines(engines)
	if err != nil {
		return err
	}
	for _, e := range engines {
		r.gpu.shards = append(r.gpu.shards, &gpuShard{e: e, grams: map[string]*deviceGram{}, spare: map[int][]cuda.DevicePtr{}})
	}
	r.gpu.upper = r.gpu.sumsUpper()
	start := time.Now()
	r.calibrating = start
	if len(devs) == 1 {
		err = r.gpu.first().Calibrate(m, seqs, cal, opt)
	} else {
		err = model.CalibrateSharded(r.gpu.engines(), m, seqs, cal, opt)
	}
	if err != nil {
		return err
	}
	if cal == shardedCalibrator(r) { // GPTQ's pass: every linear is solved
		go r.closeSolvers() // the solvers' memory goes while the engines' does and the writer finishes
	}
	total := time.Since(start)
	r.gpuPeak = r.gpu.peak()
	if r.awq != nil && !r.awq.gptq {
		return nil // AWQ's own line tells where the time went
	}
	ct := r.gpu.first().CalibrationTimes()
	sums := fmt.Sprintf(" (solving and replacing weights %.1f s", time.Duration(r.solving.Load()).Seconds())
	if len(devs) > 1 {
		sums += fmt.Sprintf(", Hessians summed across GPUs %.2f s", r.gpu.sums.Seconds())
	}
	sums += ")"
	var peaks []string
	for _, sh := range r.gpu.shards {
		peaks = append(peaks, fmt.Sprintf("%.2f", float64(sh.e.PeakMemoryUsed())/1e9))
	}
	r.logf("%s on %s (solvers and engines made in %.2f s): %d×%d calibration tokens, %.1f s: forward passes and Hessians %.1f s (weights up %.1f s, observing passes %.1f s, replaced weights up %.1f s, block outputs %.1f s), GPTQ %.1f s%s; peak GPU memory in use %s GB\n",
		r.method, gpuNames(devs), r.setup.Seconds(), len(seqs), len(seqs[0]), total.Seconds(), (total - r.gpu.solve).Seconds(),
		ct.Upload.Seconds(), ct.Observe.Seconds(), ct.Refresh.Seconds(), ct.Output.Seconds(), r.gpu.solve.Seconds(), sums, strings.Join(peaks, ", "))
	return nil
}

// shardedCalibrator observes a calibration on one GPU or on several.
type shardedCalibrator interface {
	model.GPUCalibrator
	model.ShardedCalibrator
}

// newEngines makes a calibration engine on each GPU, all at once (each loads its kernels and
// makes its cuBLAS handle); on an error the engines made are returned with it, to be closed.
func (r *blockRunner) newEngines(devs []*cuda.Device, cfg *model.Config) ([]*model.GPU, error) {
	return newEngines(devs, cfg, r.math)
}

// newEngines makes an engine with options opt on each of devs, all at once.
func newEngines(devs []*cuda.Device, cfg *model.Config, opt model.GPUOptions) ([]*model.GPU, error) {
	engines := make([]*model.GPU, len(devs))
	var making errgroup.Group
	for i, dev := range devs {
		making.Go(func() (err error) {
			defer timeline.Begin(dev.Info().Ordinal, "calibration engine")()
			if engines[i], err = model.NewGPU(dev, cfg, opt); err == nil && cfg.Layers > 2 {
				_ = engines[i].PrepareUploadsAhead() // on failure, tried again when the second block begins
			}
			return err
		})
	}
	return engines, making.Wait()
}

// enginesAhead is the calibration engines made in the background while the GPTQ solvers are:
// both load kernels and make cuBLAS handles and pinned buffers on every GPU, and made one after
// the other they held the calibration's start by a few hundred milliseconds.
type enginesAhead struct {
	done    chan struct{}
	devs    []*cuda.Device
	engines []*model.GPU
	err     error
}

// startEngines makes an engine on each of devs once the opening model's configuration is read.
func (r *blockRunner) startEngines(devs []*cuda.Device, opening *modelOpening) *enginesAhead {
	a := &enginesAhead{done: make(chan struct{}), devs: devs}
	go func() {
		defer close(a.done)
		var cfg *model.Config
		if cfg, a.err = opening.config(); a.err == nil {
			a.engines, a.err = r.newEngines(devs, cfg)
		}
	}()
	return a
}

// engines returns a calibration engine on each of devs: the ones made ahead when they are for
// these GPUs, otherwise new ones (those made ahead are closed). The wait counts as setup.
func (r *blockRunner) engines(devs []*cuda.Device, cfg *model.Config) ([]*model.GPU, error) {
	defer func(start time.Time) { r.setup += time.Since(start) }(time.Now())
	var engines []*model.GPU
	var err error
	if a := r.ahead; a != nil && slices.Equal(a.devs, devs) {
		<-a.done
		r.ahead = nil
		engines, err = a.engines, a.err
	} else {
		r.dropEngines()
		engines, err = r.newEngines(devs, cfg)
	}
	if err == nil && r.solver != nil {
		for _, e := range engines {
			e.Reserve(solverReserve(cfg, len(devs)))
		}
	}
	return engines, err
}

// tensorsAhead makes the result tensors of a dense model's GPTQ solves in the background
// (newResultTensor), kept by kind (scheme and shape) for the solves that take them. A tensor's
// fresh pages fault in at about 3 GB/s: a 70B block's seven result tensors hold 1.1 GB, and q_proj's
// 64 MB, made when its solve began, held that solve by 30–40 ms. So after each Update the same
// group's tensors are made for the next block, during the passes that follow (the host waits for
// the GPUs then); a block whose tensors were not all made so (the first, or one planned
// differently) makes the rest at its first Update.
type tensorsAhead struct {
	mu    sync.Mutex
	block int // the block whose first Update last counted its tensors (start)
	last  int // the model's last block: nothing is made after its Updates
	made  map[tensorKind][]chan *quant.Tensor
}

// tensorKind is what makes result tensors interchangeable.
type tensorKind struct {
	s    quant.Scheme
	n, k int
}

// plannedKinds returns the kinds of the tensors that the solves of the groups' linears in block b
// take (planned gives a linear's scheme, when it has one that the GPU solves).
func plannedKinds(b *model.Block, groups []model.Group, planned func(*model.Linear) (quant.Scheme, bool)) []tensorKind {
	var kinds []tensorKind
	for _, g := range groups {
		for _, l := range b.Linears(g) {
			if s, ok := planned(l); ok {
				kinds = append(kinds, tensorKind{s, l.Out, l.In})
			}
		}
	}
	return kinds
}

// start makes, at block b's first Update, the tensors that block b's solves will take and that
// are not made already; the made tensors that b takes none of are dropped.
func (a *tensorsAhead) start(b *model.Block, planned func(*model.Linear) (quant.Scheme, bool)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.made != nil && a.block == b.Index {
		return
	}
	a.block = b.Index
	need := map[tensorKind]int{}
	for _, kind := range plannedKinds(b, b.Groups(), planned) {
		need[kind]++
	}
	made := map[tensorKind][]chan *quant.Tensor{}
	for kind, n := range need {
		made[kind] = a.made[kind][:min(n, len(a.made[kind]))]
		for range n - len(made[kind]) {
			made[kind] = append(made[kind], makeTensor(kind))
		}
	}
	a.made = made
}

// next makes, after an Update of block b's groups, their tensors for the next block's solves of
// the same groups.
func (a *tensorsAhead) next(b *model.Block, groups []model.Group, planned func(*model.Linear) (quant.Scheme, bool)) {
	if b.Index >= a.last {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, kind := range plannedKinds(b, groups, planned) {
		a.made[kind] = append(a.made[kind], makeTensor(kind))
	}
}

// makeTensor makes a tensor of the kind in the background.
func makeTensor(kind tensorKind) chan *quant.Tensor {
	made := make(chan *quant.Tensor, 1)
	go func() { made <- newResultTensor(kind.s, kind.n, kind.k) }()
	return made
}

// take returns a tensor for linear l of scheme s: one made ahead, or a new one.
func (a *tensorsAhead) take(l *model.Linear, s quant.Scheme) *quant.Tensor {
	kind := tensorKind{s, l.Out, l.In}
	a.mu.Lock()
	var made chan *quant.Tensor
	if q := a.made[kind]; len(q) > 0 {
		made, a.made[kind] = q[0], q[1:]
	}
	a.mu.Unlock()
	if made != nil {
		return <-made
	}
	defer timeline.Begin(timeline.Host, "result tensor of %s", l.Name)()
	return newResultTensor(s, l.Out, l.In)
}

// newResultTensor is gptq.NewRowsTensor with its memory touched: fresh pages are faulted in by
// the kernel on their first write, which was the codes' copy from the GPU, on the solve's path
// (a 7B block's codes are 0.2 GB), and is now the goroutine that makes the tensor ahead.
func newResultTensor(s quant.Scheme, n, k int) *quant.Tensor {
	t := gptq.NewRowsTensor(s, n, k)
	for _, b := range [][]byte{t.Codes, cuda.Bytes(t.Scales), t.Zeros} {
		for i := 0; i < len(b); i += 4096 {
			b[i] = 0
		}
	}
	return t
}

// warmer returns how to warm the solver sets of a calibration on shards GPUs: on each GPU at
// once, the first set's solver factors a synthetic Hessian as wide as the most common planned
// linear's input, then each set that will solve such linears (all of them where linears that wide
// are solved at once: parallelSolves) solves that linear's row share with it
// (gptq.GPUSolver.WarmFactor and Warm), so that the first block does not wait for what the
// driver, cuBLAS and cuSOLVER do on first use.
func (r *blockRunner) warmer(shards int) func([]solverSet) {
	w := r.warmShape
	n := shares.Even(w.n, min(shards, w.n))[1]
	return func(sets []solverSet) {
		if !sets[0].first().Supports(w.s, r.opt) { // the CPU solves these
			return
		}
		if !r.parallelSolves(w.k) { // only the first set solves linears this wide: the others stay small
			sets = sets[:1]
		}
		var warming sync.WaitGroup
		for d, first := range sets[0] {
			warming.Go(func() {
				f, err := first.WarmFactor(w.k, r.opt)
				if err != nil {
					r.logf("GPTQ solver warm-up: %v\n", err) // the solves will meet it again if it matters
					return
				}
				var solves sync.WaitGroup
				for _, set := range sets {
					solves.Go(func() {
						if err := set[d].Warm(n, f, w.s, r.opt); err != nil {
							r.logf("GPTQ solver warm-up: %v\n", err)
						}
					})
				}
				solves.Wait()
			})
		}
		warming.Wait()
	}
}

// dropEngines closes the engines made ahead, if no calibration took them.
func (r *blockRunner) dropEngines() {
	if a := r.ahead; a != nil {
		<-a.done
		r.ahead = nil
		closeEngines(a.engines)
	}
}

// closeEngines closes the engines made, all at once (freeing device and pinned memory waits
// for each GPU).
func closeEngines(engines []*model.GPU) {
	defer timeline.Begin(timeline.Host, "close the calibration engines")()
	var closing sync.WaitGroup
	for _, e := range engines {
		if e != nil {
			closing.Go(func() { e.Close() })
		}
	}
	closing.Wait()
}

// solverReserve estimates the GPU memory that GPTQ takes on each GPU at its largest, for the
// engine to leave free (model.GPU.Reserve): the solver of the widest input (20·k² bytes counted
// for H's factor in float64, H in float32 and T′, which take 16 (H itself is read from the Gram
// matrix); about 13·n·k for a row share's weights, codes and the baseline's product), two more
// solving a narrower group at once, and the widest Gram matrix. A Llama-2-70B-shaped model needs
// 32 GB of it on one GPU, 25 GB on each of four.
func solverReserve(cfg *model.Config, shards int) uint64 {
	widest := uint64(max(cfg.Hidden, cfg.Intermediate, cfg.MoE.Intermediate, cfg.MoE.SharedIntermediate))
	largest := uint64(cfg.Hidden) * widest / uint64(shards) // n·k of a row share of the largest linear
	solver := func(k uint64) uint64 { return 20*k*k + 13*largest }
	return solver(widest) + 2*solver(uint64(cfg.Hidden)) + 4*widest*widest
}

// gpuNames names the GPUs of a calibration: "NVIDIA H100" or "4 × NVIDIA H100".
func gpuNames(devs []*cuda.Device) string {
	if len(devs) == 1 {
		return devs[0].Info().Name
	}
	return fmt.Sprintf("%d × %s", len(devs), devs[0].Info().Name)
}

// first is the first GPU's engine.
func (c *gpuCapture) first() *model.GPU { return c.shards[0].e }

func (c *gpuCapture) engines() []*model.GPU {
	var es []*model.GPU
	for _, s := range c.shards {
		es = append(es, s.e)
	}
	return es
}

// peak is the most GPU memory in use on any of the GPUs.
func (c *gpuCapture) peak() uint64 {
	var p uint64
	for _, s := range c.shards {
		p = max(p, s.e.PeakMemoryUsed())
	}
	return p
}

func (c *gpuCapture) free() {
	for _, s := range c.shards {
		s.e.Device().Release(&s.band)
		s.e.Device().Release(&s.peer)
		for _, g := range s.grams {
			s.e.Device().Free(g.sum)
		}
		for _, ptrs := range s.spare {
			s.e.Device().FreeAll(ptrs)
		}
	}
}

// keep makes shard i's Gram buffer gr spare once its group is solved (work queued later on the
// engine's stream, its zeroing when reused, runs after every read of it), or frees it where two
// of its size are spare already (the experts' many Hessians).
func (c *gpuCapture) keep(i int, gr *deviceGram) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sh := c.shards[i]
	if len(sh.spare[gr.k]) >= 2 {
		sh.e.Synchronize()
		sh.e.Device().Free(gr.sum)
		return
	}
	sh.spare[gr.k] = append(sh.spare[gr.k], gr.sum)
}

// ObserveGPU adds x's Gram matrix to its group's sum (one GPU: AWQ's scaler hands GPTQ's inputs here).
func (r *blockRunner) ObserveGPU(block int, g model.Group, x cuda.DevicePtr, rows, cols int) error {
	return r.ObserveShard(0, block, g, x, rows, cols)
}

// ObserveShard adds x, on the GPU of shard, to that GPU's partial Gram matrix of the group.
func (r *blockRunner) ObserveShard(shard, block int, g model.Group, x cuda.DevicePtr, rows, cols int) error {
	if r.stopped.Load() {
		return errors.New("stopped")
	}
	sh := r.gpu.shards[shard]
	gr, err := r.gpu.gram(sh, block, g, rows, cols, r.experts)
	if err != nil {
		return err
	}
	if rows == 0 { // an expert no token of this chunk was routed to
		return nil
	}
	return sh.e.AddGram(gr.sum, x, rows, cols)
}

// gram returns shard sh's Gram matrix of group g of block, made and zeroed on its first use,
// with rows counted (an expert's routed tokens over all the shards: its count starts with the
// first shard's matrix).
func (c *gpuCapture) gram(sh *gpuShard, block int, g model.Group, rows, cols int, experts *expertRouting) (*deviceGram, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := hessianKey(block, g)
	gr := sh.grams[key]
	if gr == nil {
		if !c.gathering(key) {
			experts.start(block, g)
		}
		p, err := sh.newGram(cols)
		if err != nil {
			return nil, fmt.Errorf("block %d, Hessian of %s: %w", block, g, err)
		}
		gr = &deviceGram{sum: p, k: cols}
		sh.grams[key] = gr
		if err := sh.e.Device().Fill32Async(p, 0, cols*cols, sh.e.Stream()); err != nil {
			return nil, err
		}
	}
	experts.add(block, g, rows)
	gr.n += rows
	return gr, nil
}

// gpuSolveFunc solves with group g's Gram matrix where it was gathered, on the GPUs (H = 2/n·Σ
// xᵀx is made there; only its diagonal comes back), factored once for all the group's linears
// (factor). With several GPUs the partial sums are added up first (sumShards) and each GPU
// solves a share of each linear's rows: GPTQ treats rows independently given H.
func (r *blockRunner) gpuSolveFunc(block int, g model.Group) (solveFunc, func(), error) {
	grams, err := r.gpu.take(hessianKey(block, g))
	if err != nil {
		return nil, nil, fmt.Errorf("block %d: %s: %w", block, g, err)
	}
	release := func() {
		for i, gr := range grams {
			r.gpu.keep(i, gr)
		}
	}
	if err := r.gpu.sumShards(grams); err != nil {
		release()
		return nil, nil, fmt.Errorf("block %d, Hessian of %s: %w", block, g, err)
	}
	var host []float64 // H on the host, fetched for the first linear the CPU solves
	var hostOnce sync.Once
	var hostErr error
	factored := r.factorsOf(grams)
	solve := func(l *model.Linear, s quant.Scheme, global float32, set solverSet) (solveResults, error) {
		if first := set.first(); first != nil && first.Supports(s, r.opt) {
			result := make(chan *quant.Tensor, 1)
			go func() { result <- r.tensors.take(l, s) }() // touching tens of MB, if not done ahead: while the GPUs factor
			factors, err := factored.on(set.shards())
			t := <-result
			if err != nil {
				return nil, fmt.Errorf("block %d, Hessian of %s: %w", block, g, err)
			}
			results, err := r.solveRows(l, s, t, factors, set)
			if err != nil {
				err = fmt.Errorf("block %d, input of %s: %w", block, g, err)
			}
			return results, err
		}
		hostOnce.Do(func() { host, hostErr = r.hostHessian(r.gpu.shards[0].e.Device(), grams[0]) }) // NF4, k-quants (or the clip search off amd64): the CPU solves
		if hostErr != nil {
			return nil, fmt.Errorf("block %d, Hessian of %s: %w", block, g, hostErr)
		}
		return solvedNow(gptq.Quantize(l.W, l.Out, l.In, host, s, r.optFor(global)))
	}
	return solve, release, nil
}

// gpuFactors are a group's summed Hessian factored on each GPU that solves with it, made for the
// first solve there: on every GPU at once for solves whose rows every GPU shares, or on one GPU
// for the solves placed there (solveSpread).
type gpuFactors struct {
	r       *blockRunner
	grams   []*deviceGram
	mu      sync.Mutex
	factors []*gptq.Factor // by shard; nil where none is made yet
	err     error
}

func (r *blockRunner) factorsOf(grams []*deviceGram) *gpuFactors {
	return &gpuFactors{r: r, grams: grams, factors: make([]*gptq.Factor, len(grams))}
}

// on returns the factors by shard, those of shards made now where missing (the first failure
// is every later call's too).
func (f *gpuFactors) on(shards []int) ([]*gptq.Factor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var missing []int
	for _, i := range shards {
		if f.factors[i] == nil {
			missing = append(missing, i)
		}
	}
	if f.err == nil && len(missing) > 0 {
		var made []*gptq.Factor
		if made, f.err = f.r.factor(f.grams, missing); f.err == nil {
			for j, i := range missing {
				f.factors[i] = made[j]
			}
		}
	}
	return slices.Clone(f.factors), f.err
}

// factor factors the group's summed Hessian once on each GPU of shards, for all its linears
// there, with the first solver of each (gptq.FactorGramOnAll: every GPU factors its copy, the
// same bits).
func (r *blockRunner) factor(grams []*deviceGram, shards []int) ([]*gptq.Factor, error) {
	defer timeline.Begin(timeline.Host, "factor H (k = %d)", grams[0].k)()
	makers := make([]*gptq.GPUSolver, len(shards))
	sums := make([]cuda.DevicePtr, len(shards))
	for j, i := range shards {
		makers[j], sums[j] = r.all[0][i], grams[i].sum
	}
	return gptq.FactorGramOnAll(makers, sums, grams[0].k, 2/float64(grams[0].n), r.opt)
}

// gathering says whether a shard gathers the Gram matrix of key (under c.mu).
func (c *gpuCapture) gathering(key string) bool {
	return slices.ContainsFunc(c.shards, func(sh *gpuShard) bool { return sh.grams[key] != nil })
}

// take removes the group's Gram matrices (one per shard, all gathered) from the shards once
// their accumulations have finished, each made whole (model.GPU.FinishGram) unless sumShards
// will add up their upper triangles first.
func (c *gpuCapture) take(key string) ([]*deviceGram, error) {
	grams := make([]*deviceGram, len(c.shards))
	rows := 0
	for i, sh := range c.shards {
		grams[i] = sh.grams[key]
		delete(sh.grams, key)
		if grams[i] != nil {
			rows += grams[i].n
		}
	}
	if rows == 0 || slices.Contains(grams, nil) { // (a shard that no token of an expert reached has its zeros)
		for j, gr := range grams {
			if gr != nil {
				c.keep(j, gr)
			}
		}
		return nil, errors.New("no calibration inputs reached it")
	}
	err := c.eachShard(func(i int, sh *gpuShard) error {
		if !c.upper { // summed whole, or not at all: made whole now
			if err := sh.e.FinishGram(grams[i].sum, grams[i].k); err != nil {
				return err
			}
		}
		return sh.e.Synchronize() // the Gram's last accumulation
	})
	if err != nil {
		return nil, err
	}
	return grams, nil
}

// sumsUpper says whether sumShards adds up the Gram matrices' upper triangles in place, every
// GPU reading and writing the others' memory directly (sumUpper): with several GPUs that all
// reach each other's memory, and no more of them than one kernel takes.
func (c *gpuCapture) sumsUpper() bool {
	if len(c.shards) < 2 || len(c.shards) > model.MaxSumShards {
		return false
	}
	devs := make([]*cuda.Device, len(c.shards))
	for i, sh := range c.shards {
		devs[i] = sh.e.Device()
	}
	return cuda.AllReach(devs)
}

// sumShards makes each shard's Gram matrix the sum over all shards, every sum added in shard
// order, as one GPU adding the others' copies would: with sumUpper where the GPUs reach each
// other's memory, else with sumCopied.
func (c *gpuCapture) sumShards(grams []*deviceGram) error {
	if len(grams) == 1 {
		return nil
	}
	defer func(start time.Time) { c.sums += time.Since(start) }(time.Now())
	total := 0
	for _, gr := range grams {
		total += gr.n
	}
	var err error
	if c.upper {
		err = c.sumUpper(grams)
	} else {
		err = c.sumCopied(grams)
	}
	if err != nil {
		return err
	}
	for _, gr := range grams {
		gr.n = total
	}
	return nil
}

// sumUpper adds up the upper triangles of the partial Gram matrices (as accumulated, before
// FinishGram) in place on all GPUs at once: GPU c sums the columns of band c of every matrix,
// reading the others' over NVLink or PCIe and writing the total into every one of them
// (model.GPU.SumUpperShards), the bands balanced by their triangles' area; each GPU then
// mirrors its own. Each GPU reads and writes (n−1)/n of a triangle over the links, half of what
// copying whole bands moves, in one kernel instead of 2·(n−1) copies and n−1 additions.
func (c *gpuCapture) sumUpper(grams []*deviceGram) error {
	k := grams[0].k
	sums := make([]cuda.DevicePtr, len(grams))
	for i, gr := range grams {
		sums[i] = gr.sum
	}
	bands := shares.Upper(k, len(grams))
	err := c.eachShard(func(i int, sh *gpuShard) error {
		defer timeline.Begin(sh.e.Device().Info().Ordinal, "sum Hessian band")()
		if err := sh.e.SumUpperShards(sums, k, bands[i], bands[i+1]); err != nil {
			return err
		}
		return sh.e.Synchronize()
	})
	if err != nil {
		return err
	}
	// Every band is summed in every matrix: each GPU mirrors its own.
	return c.eachShard(func(i int, sh *gpuShard) error {
		defer timeline.Begin(sh.e.Device().Info().Ordinal, "mirror summed Hessian")()
		if err := sh.e.FinishGram(grams[i].sum, k); err != nil {
			return err
		}
		return sh.e.Synchronize()
	})
}

// sumCopied sums whole Gram matrices (after FinishGram) on all GPUs at once: GPU c
// adds up band c of the partial sums' rows in shard order (the others' bands copied from their
// memory, directly where the GPUs allow it, else staged by the driver), then every GPU copies
// every band's total from the GPU that made it. Each GPU moves 2·(n−1)/n of a matrix, where the
// first GPU alone moved 2·(n−1) of them.
func (c *gpuCapture) sumCopied(grams []*deviceGram) error {
	k := grams[0].k
	bands := shares.Even(k, len(grams))
	band := func(gr *deviceGram, i int) (cuda.DevicePtr, int) {
		return gr.sum.Add(4 * bands[i] * k), (bands[i+1] - bands[i]) * k
	}
	err := c.eachShard(func(i int, sh *gpuShard) error {
		dev := sh.e.Device()
		defer timeline.Begin(dev.Info().Ordinal, "sum Hessian band")()
		_, count := band(grams[i], i)
		if err := errors.Join(dev.Grow(&sh.band, 4*count), dev.Grow(&sh.peer, 4*count)); err != nil {
			return err
		}
		for j, gr := range grams {
			src, _ := band(gr, i)
			if j == 0 {
				if err := dev.CopyFromPeerAsync(sh.band.Ptr, c.shards[j].e.Device(), src, 4*count, sh.e.Stream()); err != nil {
					return err
				}
				continue
			}
			if j != i { // the own band is added where it is
				if err := dev.CopyFromPeerAsync(sh.peer.Ptr, c.shards[j].e.Device(), src, 4*count, sh.e.Stream()); err != nil {
					return err
				}
				src = sh.peer.Ptr
			}
			if err := sh.e.AddFloats(sh.band.Ptr, src, count); err != nil {
				return err
			}
		}
		return sh.e.Synchronize()
	})
	if err != nil {
		return err
	}
	// Every band is summed (and no GPU reads the partial sums any more): gather the totals.
	return c.eachShard(func(i int, sh *gpuShard) error {
		defer timeline.Begin(sh.e.Device().Info().Ordinal, "gather Hessian bands")()
		for j, from := range c.shards {
			dst, count := band(grams[i], j)
			if err := sh.e.Device().CopyFromPeerAsync(dst, from.e.Device(), from.band.Ptr, 4*count, sh.e.Stream()); err != nil {
				return err
			}
		}
		return sh.e.Synchronize()
	})
}

// eachShard runs f for every shard at once and returns the errors joined.
func (c *gpuCapture) eachShard(f func(i int, sh *gpuShard) error) error {
	var all sync.WaitGroup
	errs := make([]error, len(c.shards))
	for i, sh := range c.shards {
		all.Go(func() { errs[i] = f(i, sh) })
	}
	all.Wait()
	return errors.Join(errs...)
}

// gptqReplaceOnGPU lets GPTQ put its solved weights straight into the GPU engines' copies
// (replacesOnGPU; tests turn it off to compare with the host's dequantization and upload).
var gptqReplaceOnGPU = true

// replacesOnGPU says whether an Update of the groups of block b replaces the engines'
// copies of the solved weights on the GPUs (gptq.GPUSolver.DequantizeTo, then peer copies of the
// row shares): when every planned linear of the groups is solved there from the engines' copies.
// The host's copies of those linears then keep their old values: the block's calibration reads
// the engines' copies only, and the block is released after it (model.CalibrateOptions.ReleaseBlocks).
func (r *blockRunner) replacesOnGPU(b *model.Block, groups []model.Group) bool {
	if !gptqReplaceOnGPU || r.gpu == nil || r.solver.first() == nil {
		return false
	}
	for _, g := range groups {
		for _, l := range b.Linears(g) {
			s, planned := r.schemes[l.Name]
			if !planned {
				continue
			}
			if !r.solver.first().Supports(s, r.opt) {
				return false
			}
			for _, sh := range r.gpu.shards {
				if _, ok := sh.e.LinearWeights(l); !ok {
					return false
				}
			}
		}
	}
	return true
}

// keepDeviceWeights tells every engine that the Update put the changed weights into its copy.
func (c *gpuCapture) keepDeviceWeights() error {
	for _, sh := range c.shards {
		if err := sh.e.KeepDeviceWeights(); err != nil {
			return err
		}
	}
	return nil
}

// solveRows runs GPTQ on linear l with the group's factored Hessian on the GPUs that have a
// solver in set (all of them, or one: solveSpread), each taking a share of l's rows with its
// solver, its factor (factors by GPU) and the
// engine's copy of its rows, straight into t (gptq.NewRowsTensor; gptq.GPUSolver.SolveFactored).
// The engine's copy equals l.W (AWQ folds its scales into both first), so it is copied on the
// device instead of sent over the bus again. With r.onGPU each share's dequantized rows then
// replace the engine's copy there and are copied to the other engines (replaceRows). It returns
// then, with how to get t: the codes and group parameters come down from the GPUs when asked for.
func (r *blockRunner) solveRows(l *model.Linear, s quant.Scheme, t *quant.Tensor, factors []*gptq.Factor, set solverSet) (solveResults, error) {
	n, k := l.Out, l.In
	shards := set.shards()
	shards = shards[:min(len(shards), n)]
	at := shares.Even(n, len(shards))
	solved := make([]*gptq.Solved, len(shards))
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for p, i := range shards {
		wg.Go(func() {
			defer timeline.Begin(r.gpu.shards[i].e.Device().Info().Ordinal, "solve %s", l.Name)()
			lo, hi := at[p], at[p+1]
			src, ok := r.gpu.shards[i].e.LinearWeights(l)
			if ok {
				src = src.Add(4 * lo * k)
			}
			solved[p], errs[p] = set[i].SolveFactored(t, lo, l.W[lo*k:hi*k], src, hi-lo, factors[i], s, r.opt)
			if errs[p] == nil && r.onGPU {
				errs[p] = set[i].DequantizeTo(src)
			}
		})
	}
	wg.Wait()
	results := func() (*quant.Tensor, gptq.Stats, error) { return joinShares(t, solved) }
	err := errors.Join(errs...)
	if err == nil && r.onGPU && len(r.gpu.shards) > 1 {
		if err = r.gpu.replaceRows(l, shards, at); err != nil {
			err = fmt.Errorf("%s: %w", l.Name, err)
		}
	}
	if err != nil {
		results() // the shares solved bring their results down: their solvers wait for that
		return nil, err
	}
	return results, nil
}

// joinShares brings down the results of a linear's row shares (nil where a share's solve failed),
// all at once, and makes t of them.
func joinShares(t *quant.Tensor, solved []*gptq.Solved) (*quant.Tensor, gptq.Stats, error) {
	rows := make([]*quant.Tensor, len(solved))
	sts := make([]gptq.Stats, len(solved))
	errs := make([]error, len(solved))
	var wg sync.WaitGroup
	for i, sv := range solved {
		if sv != nil {
			wg.Go(func() { rows[i], sts[i], errs[i] = sv.Results() })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, gptq.Stats{}, err
	}
	if slices.Contains(solved, nil) {
		return nil, gptq.Stats{}, errors.New("a share of the rows was not solved")
	}
	for _, p := range rows[1:] {
		if !slices.Equal(p.GIdx, rows[0].GIdx) {
			return nil, gptq.Stats{}, errors.New("the GPUs ordered the columns differently") // one H, one order: a bug if seen
		}
	}
	t.GIdx = rows[0].GIdx
	return t, joinStats(sts), nil
}

// replaceRows copies the share of l's replaced rows that each engine of from solved (rows
// [at[p], at[p+1]) on engine from[p]) to every other engine, peer to peer, and waits for the
// copies.
func (c *gpuCapture) replaceRows(l *model.Linear, from []int, at []int) error {
	rowBytes := 4 * l.In
	var copies errgroup.Group
	for j, to := range c.shards {
		copies.Go(func() error {
			defer timeline.Begin(to.e.Device().Info().Ordinal, "replaced rows of %s", l.Name)()
			dst, _ := to.e.LinearWeights(l)
			for p, i := range from {
				if i == j {
					continue
				}
				src, _ := c.shards[i].e.LinearWeights(l)
				off := at[p] * rowBytes
				if err := to.e.Device().CopyFromPeerAsync(dst.Add(off), c.shards[i].e.Device(), src.Add(off), (at[p+1]-at[p])*rowBytes, to.e.Stream()); err != nil {
					return err
				}
			}
			return to.e.Device().SynchronizeStream(to.e.Stream())
		})
	}
	return copies.Wait()
}

// joinStats combines the stats of one linear's row shares: the losses add up; damping, dead
// columns and retries are those of the shared H; the times are the slowest share's.
func joinStats(parts []gptq.Stats) gptq.Stats {
	st := parts[0]
	for _, p := range parts[1:] {
		st.Loss += p.Loss
		st.Baseline += p.Baseline
		st.Factor, st.Total = max(st.Factor, p.Factor), max(st.Total, p.Total)
		st.Setup, st.BaselineTime = max(st.Setup, p.Setup), max(st.BaselineTime, p.BaselineTime)
	}
	if st.Baseline != 0 {
		st.RelativeLoss = st.Loss / st.Baseline
	}
	return st
}

// hostHessian brings a Gram matrix gathered on the GPU to the host as the CPU solver's
// H = 2/n·Σ xᵀx in float64. The GEMM that summed it may round (i, j) and (j, i) differently,
// so the two are averaged: the solver requires an exactly symmetric H.
func (r *blockRunner) hostHessian(dev *cuda.Device, gr *deviceGram) ([]float64, error) {
	k := gr.k
	buf := make([]byte, 4*k*k)
	if err := dev.CopyFromDevice(buf, gr.sum); err != nil {
		return nil, err
	}
	at := func(i int) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))) }
	h := make([]float64, k*k)
	scale := 1 / float64(gr.n) // 2/n · ½(a + b)
	for i := 0; i < k; i++ {
		for j := i; j < k; j++ {
			v := scale * (at(i*k+j) + at(j*k+i))
			h[i*k+j], h[j*k+i] = v, v
		}
	}
	return h, nil
}

func hessianKey(block int, g model.Group) string { return fmt.Sprintf("%d/%s", block, g) }
