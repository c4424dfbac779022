package convert

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/awq"
	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/shares"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
	"golang.org/x/sync/errgroup"
)

// AWQOptions are the AWQ variant's settings (`--method awq` and `awq+gptq`).
type AWQOptions struct {
	// SearchTokens is how many calibration tokens (evenly spaced over all of them) the α search
	// measures its loss on; 0 means DefaultAWQSearchTokens. mean|x| always uses every token.
	SearchTokens int
	// NoClip skips the clipping search.
	NoClip bool
	// Duo uses AutoAWQ's duo-scaling candidates (weights' relative magnitude in the scale).
	Duo bool
}

// DefaultAWQSearchTokens keeps the α search's GEMMs small on a CPU: 8192 of the 65,536 tokens
// of 128 × 512 (AutoAWQ uses all of them).
const DefaultAWQSearchTokens = 8192

// awqScaler runs AWQ inside a block-by-block calibration (model.Calibrate): for each block it
// gathers every group's inputs with the block as loaded, searches the four scales, folds them
// into the block, then either clips and quantizes (awq) or lets GPTQ quantize the scaled block
// (awq+gptq: GPTQ's Hessians are gathered on the scaled inputs). Under awq, as in AutoAWQ, each
// block runs once and its unquantized outputs are the next block's inputs (ObserveOnly): every
// search sees the unquantized model's activations. On small-llama that gave 8.894 against 8.906
// when the quantized block's outputs were passed on (README). Under awq+gptq the dequantized
// weights are put back and the next block's inputs come from the quantized block, as GPTQ's
// pipeline needs.
type awqScaler struct {
	r      *blockRunner // delivers results, holds the plan; quantizes with GPTQ under awq+gptq
	opt    awq.Options
	gptq   bool
	noClip bool
	tokens int // search tokens
	stride int // every stride-th calibration token is kept for the searches
	total  int // calibration tokens
	inputs map[string]groupInputs
	scaled map[int]bool    // awq+gptq: blocks already scaled, now in GPTQ's steps
	kept   map[string]bool // unquantized block tensors the folding may change, delivered by name

	// On the GPUs: a search on each (none: the searches run on the CPU), each GPU's inputs of
	// each group for its share of the tokens and, on several GPUs, the inputs of all the tokens
	// joined on the GPU that searches the group's scale (both reused block after block).
	gpus      []*awq.GPUSearch
	gpuInput  []map[model.Group]*awq.DeviceInputs
	joined    map[model.Group]*awq.DeviceInputs
	observing map[string][]*awq.DeviceInputs // the block's inputs by group, one per GPU, until Update joins them
	starts    []int                          // the index of each GPU's first token, and the count of all (shares.Even)
	mu        sync.Mutex                     // observing, while the GPUs observe at once; clip and quantize, while they quantize
	folding   map[int]chan struct{}          // awq+gptq on the GPU: closed when the host has folded the block's scales in
	passEnded map[int]bool                   // blocks of experts whose gate/up inputs every GPU has observed once (EndPass)

	search, clip, quantize time.Duration
	clipAndQuantize        time.Duration // quantizeBlock's wall time (clip and quantize add up every GPU's)
}

// useAWQ turns the runner into an AWQ runner: on the GPUs when g is not nil (the forward passes
// and both searches; under awq+gptq also GPTQ's Hessians and solvers), else on the CPU.
func useAWQ(r *blockRunner, items []Item, opt Options, g *gpu) error {
	s := &awqScaler{r: r, opt: awq.Options{Duo: opt.AWQ.Duo}, gptq: opt.Method.Solves(), noClip: opt.AWQ.NoClip, tokens: opt.AWQ.SearchTokens,
		inputs: map[string]groupInputs{}, scaled: map[int]bool{}, kept: map[string]bool{}, joined: map[model.Group]*awq.DeviceInputs{},
		observing: map[string][]*awq.DeviceInputs{}, folding: map[int]chan struct{}{}, passEnded: map[int]bool{}}
	if s.tokens <= 0 {
		s.tokens = DefaultAWQSearchTokens
	}
	for _, it := range items {
		if it.Scheme == nil && foldable(it.Info.Name) {
			s.kept[it.Info.Name] = true
			r.results[it.Info.Name] = make(chan gptqResult, 1)
		}
	}
	r.awq = s
	if g == nil {
		r.device = DeviceCPU
		return nil
	}
	if s.gptq {
		if err := r.useGPUs(g.devs); err != nil {
			return err
		}
	} else {
		r.dev, r.devs, r.device = g.dev, g.devs, DeviceCUDA
	}
	if searchesOnCPU(items) {
		return nil
	}
	s.gpus = make([]*awq.GPUSearch, len(g.devs))
	s.gpuInput = make([]map[model.Group]*awq.DeviceInputs, len(g.devs))
	var making errgroup.Group
	for i, dev := range g.devs {
		s.gpuInput[i] = map[model.Group]*awq.DeviceInputs{}
		making.Go(func() (err error) {
			if s.gpus[i], err = awq.NewGPUSearch(dev); err == nil {
				s.gpus[i].Math = awqSearchMath(opt.CalibMath)
			}
			return err
		})
	}
	return making.Wait()
}

// searchesOnCPU says that AWQ's searches run on the CPU although a GPU is there: the GPU
// searches fake-quantize to integer grids, and IQ types have none.
func searchesOnCPU(items []Item) bool {
	for _, it := range items {
		if it.Scheme != nil && it.Scheme.Grid == quant.IQuant {
			return true
		}
	}
	return false
}

// awqOnOneGPU says that AWQ calibrates on the first GPU alone: where its searches run on the CPU
// (the calibration then does too).
func awqOnOneGPU(items []Item) bool { return searchesOnCPU(items) }

// awqSearchMath is the α search's GEMM arithmetic for calibration math name (Options.CalibMath):
// scaled FP16 by default, true float32 for fp32, and TF32 under the others (BF16's 8-bit
// significand is not used for the search: it compares candidates whose losses differ by 0.1%).
func awqSearchMath(name string) awq.SearchMath {
	switch name {
	case "", CalibF16:
		return awq.SearchF16
	case CalibFP32:
		return awq.SearchF32
	}
	return awq.SearchTF32
}

// peakNote reports the GPU memory a GPU run peaked at.
func (s *awqScaler) peakNote() string {
	if s.gpus == nil {
		return ""
	}
	return fmt.Sprintf("; peak GPU memory in use %.2f GB", float64(s.r.gpuPeak)/1e9)
}

// close releases the GPU searches and their inputs.
func (s *awqScaler) close() {
	for _, ins := range append(s.gpuInput, s.joined) {
		for _, in := range ins {
			in.Free()
		}
	}
	for _, g := range s.gpus {
		if g != nil {
			g.Close()
		}
	}
}

// foldable says whether a block tensor is one that folding scales can change: the two norms and
// the linears' weights and biases (a mixture of experts' router, experts and shared expert with
// its gate included).
func foldable(name string) bool {
	t := model.ParseTensorName(name)
	if t.Block < 0 {
		return false
	}
	if t.Role.IsLinear() || t.Role == model.RoleRouter || strings.HasSuffix(t.Module, ".shared_expert_gate") {
		return t.Param == "weight" || t.Param == "bias"
	}
	return strings.HasSuffix(name, ".input_layernorm.weight") || strings.HasSuffix(name, ".post_attention_layernorm.weight")
}

// changes says whether the kept tensor name is delivered by the calibration run.
func (r *blockRunner) changes(name string) bool {
	return r != nil && r.awq != nil && r.awq.kept[name]
}

// calibrate walks the model block by block (model.Calibrate) with the scaler as calibrator.
func (s *awqScaler) calibrate(m *model.Model, seqs [][]int, opt model.CalibrateOptions) error {
	if len(seqs) == 0 {
		return fmt.Errorf("awq needs calibration sequences")
	}
	total := 0
	for _, q := range seqs {
		total += len(q)
	}
	stride := max(total/s.tokens, 1)
	s.total = total
	trueSequential := opt.TrueSequential
	opt.Steps = func(b *model.Block) [][]model.Group {
		steps := [][]model.Group{b.Groups()}
		if !s.gptq {
			return steps
		}
		if trueSequential {
			return append(steps, b.Stages()...)
		}
		return append(steps, b.Groups())
	}
	opt.ObserveOnly = !s.gptq
	opt.Experts.GateUpAgain = s.routedTwice
	s.stride = stride
	if s.gpus != nil { // the token shares of model.CalibrateSharded
		at := shares.Even(len(seqs), min(len(s.gpus), len(seqs)))
		s.starts = make([]int, len(at))
		for i := range at[1:] {
			s.starts[i+1] = s.starts[i]
			for _, q := range seqs[at[i]:at[i+1]] {
				s.starts[i+1] += len(q)
			}
		}
	}
	start := time.Now()
	var err error
	if s.gpus != nil {
		err = s.r.calibrateOnGPU(m, seqs, s, opt)
	} else {
		err = model.Calibrate(m, seqs, s, opt)
	}
	if err != nil {
		return err
	}
	all := time.Since(start)
	where := string(s.r.device)
	if s.gpus != nil {
		where += " (" + gpuNames(s.r.devs[:len(s.starts)-1]) + ")"
	}
	parts := fmt.Sprintf("clipping search %.1f s, quantization %.1f s", s.clip.Seconds(), s.quantize.Seconds())
	if len(s.starts) > 2 {
		parts = fmt.Sprintf("clipping search and quantization %.1f s (%.1f s and %.1f s over the GPUs)", s.clipAndQuantize.Seconds(), s.clip.Seconds(), s.quantize.Seconds())
	}
	s.r.logf("awq on %s: %d×%d calibration tokens (%d in the α search), %.1f s: scale search %.1f s, %s, forward passes and the rest %.1f s%s\n",
		where, len(seqs), len(seqs[0]), (total+stride-1)/stride, all.Seconds(), s.search.Seconds(), parts,
		(all - s.search - s.clipAndQuantize).Seconds(), s.peakNote())
	return nil
}

func (s *awqScaler) Observe(block int, g model.Group, x []float32, rows, cols int) error {
	if s.gptq && s.scaled[block] {
		return s.r.Observe(block, g, x, rows, cols)
	}
	if s.r.stopped.Load() {
		return fmt.Errorf("stopped")
	}
	key := hessianKey(block, g)
	in, _ := s.inputs[key].(hostInputs)
	if in.Inputs == nil {
		in = hostInputs{&awq.Inputs{Stride: s.stride}}
		s.inputs[key] = in
		s.r.experts.start(block, g)
	}
	s.r.experts.add(block, g, rows)
	if err := in.Add(x, rows, cols); err != nil {
		return fmt.Errorf("input of %s: %w", strings.Join(g.Modules(), ", "), err)
	}
	return nil
}

// ObserveGPU is Observe on the GPU: the group's mean |x| and sampled rows stay there.
func (s *awqScaler) ObserveGPU(block int, g model.Group, x cuda.DevicePtr, rows, cols int) error {
	return s.ObserveShard(0, block, g, x, rows, cols)
}

// ObserveShard is ObserveGPU for the share of the tokens of GPU shard (x is there). On several
// GPUs an expert's gate/up inputs come twice in a block's first step (routedTwice): the first
// pass adds their channel sums and counts the rows, the second keeps the sampled rows, from the
// index among all the GPUs' tokens routed to the expert that EndPass gave the GPU's first.
func (s *awqScaler) ObserveShard(shard, block int, g model.Group, x cuda.DevicePtr, rows, cols int) error {
	if s.gptq && s.scaled[block] {
		return s.r.ObserveShard(shard, block, g, x, rows, cols)
	}
	if s.r.stopped.Load() {
		return fmt.Errorf("stopped")
	}
	in, again, err := s.shardInputs(shard, block, g, rows, cols)
	if err != nil {
		return fmt.Errorf("block %d, input of %s: %w", block, strings.Join(g.Modules(), ", "), err)
	}
	e := s.r.gpu.shards[shard].e
	switch {
	case again:
		return in.Keep(e, s.gpus[shard], x, rows)
	case s.routedTwice(block) && isExpertGateUp(g):
		return in.AddSums(e, x, rows)
	}
	return in.Add(e, s.gpus[shard], x, rows)
}

// routedTwice says that the experts' gate/up inputs of block are observed twice
// (model.ExpertObservation.GateUpAgain): in AWQ's step on several GPUs, where no GPU knows before
// every GPU has routed its tokens where its share of an expert's tokens begins.
func (s *awqScaler) routedTwice(block int) bool {
	return len(s.starts) > 2 && !s.scaled[block]
}

func isExpertGateUp(g model.Group) bool {
	_, expert := g.Expert()
	return expert && g.Stage() == model.GroupGateUp.Stage()
}

// shardInputs returns GPU shard's inputs of group g in block, emptied on their first use in the
// block (reused from the blocks before where the width is the same), the rows counted; again
// says that these are an expert's gate/up rows handed again after EndPass.
func (s *awqScaler) shardInputs(shard, block int, g model.Group, rows, cols int) (in *awq.DeviceInputs, again bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := hessianKey(block, g)
	ins := s.observing[key]
	if ins == nil {
		ins = make([]*awq.DeviceInputs, len(s.r.gpu.shards))
		s.observing[key] = ins
		s.r.experts.start(block, g)
	}
	if s.passEnded[block] && isExpertGateUp(g) {
		if ins[shard] == nil {
			return nil, false, fmt.Errorf("GPU %d routed %d tokens in a second pass and none in the first", shard, rows)
		}
		return ins[shard], true, nil
	}
	s.r.experts.add(block, g, rows)
	if ins[shard] != nil {
		return ins[shard], false, nil
	}
	in = s.gpuInput[shard][g]
	if in != nil && in.Cols != cols {
		in.Free()
		in = nil
	}
	if in == nil {
		tokens := s.starts[shard+1] - s.starts[shard]
		if in, err = awq.NewDeviceInputs(s.r.gpu.shards[shard].e.Device(), cols, s.stride, tokens); err != nil {
			return nil, false, err
		}
		s.gpuInput[shard][g] = in
	}
	ins[shard] = in
	return in, false, in.Reset(s.firstToken(shard, block, g))
}

// firstToken is the index, among the tokens whose inputs group g observes, of GPU shard's first:
// its share's first token, or for an expert's routed tokens the count routed to the expert on
// the GPUs before it (known after the first pass; before it, an expert's gate/up rows are not
// kept yet, EndPass).
func (s *awqScaler) firstToken(shard, block int, g model.Group) int {
	e, expert := g.Expert()
	if !expert || g.Stage() == model.GroupDown.Stage() && s.r.experts.allTokens(block, e) {
		return s.starts[shard]
	}
	return s.routedBefore(shard, block, e)
}

// routedBefore counts the tokens routed to expert e of block on the GPUs before shard (its
// gate/up inputs' first pass over; s.mu held).
func (s *awqScaler) routedBefore(shard, block, e int) int {
	n := 0
	for _, in := range s.observing[hessianKey(block, model.ExpertGateUp(e))][:shard] {
		if in != nil {
			n += in.Tokens()
		}
	}
	return n
}

// EndPass (model.PassEnder: every GPU has observed the gate/up inputs of a block of experts)
// sets where each GPU's share of each expert's routed tokens begins, for the rows of its
// gate/up inputs handed again in the next pass.
func (s *awqScaler) EndPass(b *model.Block) error {
	if b.MoE == nil || !s.routedTwice(b.Index) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.passEnded[b.Index] = true
	for e := range b.MoE.Experts {
		for shard, in := range s.observing[hessianKey(b.Index, model.ExpertGateUp(e))] {
			if in == nil {
				continue
			}
			if err := in.Restart(s.routedBefore(shard, b.Index, e)); err != nil {
				return fmt.Errorf("block %d, expert %d: %w", b.Index, e, err)
			}
		}
	}
	return nil
}

// joinInputs makes the inputs each group of block b was observed with, for the searches: one
// GPU's own, or on several GPUs every GPU's joined on the GPU that searches the group's scale
// (the groups taken in turn by the GPUs). Each GPU's work must be finished.
func (s *awqScaler) joinInputs(b *model.Block) error {
	for i, g := range b.Groups() {
		key := hessianKey(b.Index, g)
		ins := s.observing[key]
		delete(s.observing, key)
		if ins == nil {
			continue
		}
		if len(ins) == 1 {
			s.inputs[key] = deviceInputs{ins[0], s.gpus[0], 0}
			continue
		}
		d := i % len(ins)
		dst := s.joined[g]
		if dst != nil && (dst.Cols != ins[0].Cols || dst.Device() != s.gpus[d].Device()) {
			dst.Free()
			dst = nil
		}
		if dst == nil {
			var err error
			if dst, err = awq.NewDeviceInputs(s.gpus[d].Device(), ins[0].Cols, s.stride, s.total); err != nil {
				return fmt.Errorf("block %d, input of %s: %w", b.Index, strings.Join(g.Modules(), ", "), err)
			}
			s.joined[g] = dst
		}
		if err := s.gpus[d].Join(dst, ins); err != nil {
			return fmt.Errorf("block %d, input of %s: %w", b.Index, strings.Join(g.Modules(), ", "), err)
		}
		s.inputs[key] = deviceInputs{dst, s.gpus[d], d}
	}
	return nil
}

// Update scales the block (the first call for a block), then clips and quantizes it, or under
// awq+gptq hands the later calls to GPTQ.
func (s *awqScaler) Update(b *model.Block, groups []model.Group) error {
	if s.gptq && s.scaled[b.Index] {
		if done := s.folding[b.Index]; done != nil {
			<-done // GPTQ reads and checks the host's weights
			delete(s.folding, b.Index)
		}
		return s.r.Update(b, groups)
	}
	if s.gpus != nil {
		for _, e := range s.r.gpu.engines() {
			if err := e.Synchronize(); err != nil { // the inputs are gathered
				return err
			}
		}
		// The next block's pass overwrites the inputs: the searches must be done with them.
		defer s.synchronize()
		if err := s.joinInputs(b); err != nil {
			s.r.fail(err)
			return err
		}
	}
	s.r.experts.report("awq", b, s.total)
	if err := s.scaleBlock(b); err != nil {
		s.r.fail(err)
		return err
	}
	if s.folding[b.Index] == nil {
		s.deliverKept(b)
	}
	if s.gptq {
		s.scaled[b.Index] = true
		s.dropInputs(b)
		return nil
	}
	err := s.quantizeBlock(b)
	s.dropInputs(b)
	return err
}

func (s *awqScaler) dropInputs(b *model.Block) {
	delete(s.passEnded, b.Index)
	for _, g := range b.Groups() {
		delete(s.inputs, hessianKey(b.Index, g))
	}
}

// scaleBlock searches every pair's scale on the block as loaded (on several GPUs, each GPU the
// pairs whose inputs it holds, at once), then folds them all in, and divides the kept inputs by
// them for the clipping search.
func (s *awqScaler) scaleBlock(b *model.Block) error {
	start := time.Now()
	defer func() { s.search += time.Since(start) }()
	pairs := awq.Pairs(b)
	results := make([]*awq.ScaleResult, len(pairs))
	errs := make([]error, len(pairs))
	lanes := map[int][]int{} // the pairs by the GPU whose inputs they search (0: the CPU, or one GPU)
	for i, p := range pairs {
		in, _ := s.inputs[hessianKey(b.Index, p.Group)].(deviceInputs)
		lanes[in.shard] = append(lanes[in.shard], i)
	}
	var searches sync.WaitGroup
	for _, lane := range lanes {
		searches.Go(func() {
			for _, i := range lane {
				results[i], errs[i] = s.searchPair(b, pairs[i])
			}
		})
	}
	searches.Wait()
	scales := make([][]float32, len(pairs))
	for i, p := range pairs {
		res := results[i]
		if errs[i] != nil {
			return errs[i]
		} else if res == nil {
			continue
		}
		scales[i] = res.Scales
		s.r.logf("awq block %d %s: α %.2f, output error %.4g (α=0: %.4g, %.1f%% lower)\n",
			b.Index, p.Group, res.Alpha, res.Loss, res.Loss0, 100*(1-res.Loss/math.Max(res.Loss0, 1e-30)))
	}
	if onGPU, err := s.foldOnGPU(b, pairs, scales); onGPU || err != nil {
		return err
	}
	for i, p := range pairs {
		sc := scales[i]
		if sc == nil {
			continue
		}
		awq.Fold(b, p, sc)
		for _, g := range p.Groups() {
			if in := s.inputs[hessianKey(b.Index, g)]; in != nil && !s.gptq { // the clipping search's
				if err := in.divide(sc); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// searchPair searches pair p's scale on its inputs; nil when none of its linears is planned.
func (s *awqScaler) searchPair(b *model.Block, p awq.Pair) (*awq.ScaleResult, error) {
	var ls []awq.Linear
	var block []*model.Linear
	for _, g := range p.Groups() {
		ls, block = append(ls, s.linears(b, g)...), append(block, b.Linears(g)...)
	}
	if !anyPlanned(ls) {
		return nil, nil
	}
	in := s.inputs[hessianKey(b.Index, p.Group)]
	if in == nil || in.rows() == 0 {
		return nil, fmt.Errorf("block %d: no calibration inputs reached %s", b.Index, p.Group)
	}
	if d, ok := in.(deviceInputs); ok {
		s.onGPU(d.shard, block, ls)
	}
	mean, err := in.meanAbs()
	if err != nil {
		return nil, fmt.Errorf("block %d, input of %s: %w", b.Index, strings.Join(p.Group.Modules(), ", "), err)
	}
	res, err := in.searchScale(mean, ls, s.opt)
	if err != nil {
		return nil, fmt.Errorf("block %d, %s: %w", b.Index, p.Group, err)
	}
	return &res, nil
}

// awqFoldOnGPU lets awq+gptq fold a dense block's scales into the GPU engine's copy of its
// weights (tests turn it off to compare with the host's fold and upload).
var awqFoldOnGPU = true

// foldOnGPU folds the scales into the engines' copies of a dense block under awq+gptq, where the
// host's weights are only needed again by GPTQ's step after the next observing pass: the host
// folds its copy meanwhile (s.folding[b] closes when it is done, the block's kept tensors
// delivered), and the folded weights are not uploaded again. It reports whether it did.
func (s *awqScaler) foldOnGPU(b *model.Block, pairs []awq.Pair, scales [][]float32) (bool, error) {
	if !awqFoldOnGPU || s.gpus == nil || !s.gptq || b.MoE != nil {
		return false, nil
	}
	for _, e := range s.r.gpu.engines() {
		for i, p := range pairs {
			if scales[i] != nil {
				if err := awq.FoldOnGPU(e, b, p, scales[i]); err != nil {
					return false, fmt.Errorf("block %d: folding AWQ's scales on GPU %d: %w", b.Index, e.Device().Info().Ordinal, err)
				}
			}
		}
		if err := e.KeepDeviceWeights(); err != nil {
			return false, err
		}
	}
	done := make(chan struct{})
	s.folding[b.Index] = done
	go func() {
		defer close(done)
		for i, p := range pairs {
			if scales[i] != nil {
				awq.Fold(b, p, scales[i])
			}
		}
		s.deliverKept(b)
	}()
	return true, nil
}

// linears are the group's linears with their planned schemes (nil: not quantized).
func (s *awqScaler) linears(b *model.Block, g model.Group) []awq.Linear {
	var ls []awq.Linear
	for _, l := range b.Linears(g) {
		al := awq.Linear{Name: l.Name, W: l.W, Out: l.Out, In: l.In}
		if sc, ok := s.r.schemes[l.Name]; ok {
			al.Scheme = &sc
		}
		ls = append(ls, al)
	}
	return ls
}

// onGPU points each linear at GPU shard's engine's copy of its weights, which has not been
// changed since it was uploaded (before any scale is folded).
func (s *awqScaler) onGPU(shard int, block []*model.Linear, ls []awq.Linear) {
	e := s.r.gpu.shards[shard].e
	for i, l := range block { // ls was made from block, in its order
		ls[i].OnGPU, _ = e.LinearWeights(l)
	}
}

// synchronize waits for every GPU's searches.
func (s *awqScaler) synchronize() {
	for _, g := range s.gpus {
		g.Synchronize()
	}
}

func anyPlanned(ls []awq.Linear) bool {
	for _, l := range ls {
		if l.Scheme != nil {
			return true
		}
	}
	return false
}

// quantizeBlock clips (all but q and k, whose errors meet in the q·k product) and quantizes each
// planned linear of the scaled block, puts the dequantized weights back and delivers them (on
// several GPUs, each GPU the linears whose inputs it holds, at once). An expert calibrated on
// every token clips its gate/up on every token's inputs.
func (s *awqScaler) quantizeBlock(b *model.Block) error {
	defer func(start time.Time) { s.clipAndQuantize += time.Since(start) }(time.Now())
	type job struct {
		l    awq.Linear
		in   groupInputs
		line string
		err  error
	}
	var jobs []*job
	lanes := map[int][]*job{} // by the GPU whose inputs the clipping search reads (0: the CPU, or one GPU)
	for _, g := range b.Groups() {
		in := s.inputs[hessianKey(b.Index, s.r.experts.source(b.Index, g))]
		d, _ := in.(deviceInputs)
		for _, l := range s.linears(b, g) {
			if l.Scheme != nil {
				j := &job{l: l, in: in}
				jobs, lanes[d.shard] = append(jobs, j), append(lanes[d.shard], j)
			}
		}
	}
	var quantizing sync.WaitGroup
	for _, lane := range lanes {
		quantizing.Go(func() {
			for _, j := range lane {
				if j.line, j.err = s.quantizeLinear(b, j.l, j.in); j.err != nil {
					return
				}
			}
		})
	}
	quantizing.Wait()
	for _, j := range jobs {
		if j.err != nil {
			err := fmt.Errorf("tensor %s.weight: %w", j.l.Name, j.err)
			s.r.results[j.l.Name] <- gptqResult{err: err}
			return err
		}
		if j.line != "" {
			s.r.logf("%s\n", j.line)
		}
	}
	return nil
}

// quantizeLinear clips and quantizes l and delivers it; it returns the log's line.
func (s *awqScaler) quantizeLinear(b *model.Block, l awq.Linear, in groupInputs) (string, error) {
	line := fmt.Sprintf("awq %s %s", l.Name, l.Scheme)
	isQK := strings.HasSuffix(l.Name, ".q_proj") || strings.HasSuffix(l.Name, ".k_proj")
	var clip time.Duration
	if !s.noClip && !isQK && in != nil && in.rows() > 0 {
		start := time.Now()
		res, err := in.searchClip(l, s.opt)
		if err != nil {
			return "", err
		}
		clip = time.Since(start)
		line += fmt.Sprintf(": clipped %d groups, group output error %.4g → %.4g", res.Clipped, res.Err0, res.Err)
	}
	start := time.Now()
	t, err := blockwise.Quantize(l.W, l.Out, l.In, *l.Scheme, blockwise.Options{})
	if err != nil {
		return "", err
	}
	ml, err := b.Linear(l.Name)
	if err != nil {
		return "", err
	}
	if err := ml.SetWeight(t.Dequantize(ml.W)); err != nil { // in place: the scaled W is no longer needed
		return "", err
	}
	quantize := time.Since(start)
	s.mu.Lock()
	s.clip += clip
	s.quantize += quantize
	s.mu.Unlock()
	s.r.results[l.Name] <- gptqResult{t: t}
	return fmt.Sprintf("%s, %.0fms", line, 1000*quantize.Seconds()), nil
}

// deliverKept hands the writer the block's unquantized tensors after folding (copies: the block's
// own slices may still be quantized in place).
func (s *awqScaler) deliverKept(b *model.Block) {
	p := fmt.Sprintf("model.layers.%d.", b.Index)
	send := func(name string, v []float32) {
		if s.kept[name] && v != nil {
			s.r.results[name] <- gptqResult{values: append([]float32(nil), v...)}
		}
	}
	send(p+"input_layernorm.weight", b.InputNorm)
	send(p+"post_attention_layernorm.weight", b.PostAttnNorm)
	for _, l := range b.AllLinears() {
		send(l.Name+".weight", l.W)
		send(l.Name+".bias", l.Bias)
	}
}

// changedUnit writes a kept tensor with the values the calibration run delivers, in its dtype.
func changedUnit(r *blockRunner, it Item, writes *writeTimer) unit {
	return func(out tensorSink) error {
		v, err := r.value(it.Info.Name)
		if err != nil {
			return err
		}
		switch it.Info.DType {
		case safetensors.F32, safetensors.F16, safetensors.BF16:
		default:
			return fmt.Errorf("tensor %s: AWQ's folded scales change it and it cannot be stored back as %s", it.Info.Name, it.Info.DType)
		}
		return writes.write(out, it.Info.Name, encodeFloats(v, it.Info.DType))
	}
}

// awqPlanAlpha is the exponent of the scale the allocator applies before measuring a weight's
// sensitivity under AWQ: the middle of the search grid (the searched α depends on each rung's
// scheme and on the whole block, too costly to search per rung while planning).
const awqPlanAlpha = 0.5

// awqScaled scales the sample's columns by AWQ's candidate scale from mean |x| (once per sample)
// and returns the importance of the scaled weight's input channels, mean x²/s²: the activation-
// weighted error of the weight AWQ will quantize. Without statistics it changes nothing.
func (ws *weightSample) awqScaled(meanAbs, importance []float32) []float32 {
	if len(meanAbs) != ws.k || len(importance) != ws.k {
		return importance
	}
	s := awq.Candidate(meanAbs, awqPlanAlpha)
	if !ws.scaled {
		awq.ScaleColumns(ws.w, ws.rows, ws.k, s)
		ws.scaled = true
	}
	imp := make([]float32, ws.k)
	for c, v := range importance {
		imp[c] = v / (s[c] * s[c])
	}
	return imp
}

// awqPhases are AWQ's parts of the time breakdown. Each is final once the last module's result
// has been delivered (it is added to before the delivery), so the writer's end may read them.
func (r *blockRunner) awqPhases() []Phase {
	if r.awq == nil {
		return nil
	}
	return []Phase{newPhase("awq scale search", r.awq.search.Seconds(), 0),
		newPhase("awq clipping search", r.awq.clip.Seconds(), 0), newPhase("awq quantization", r.awq.quantize.Seconds(), 0)}
}

// groupInputs is one linear group's calibration inputs and the searches over them, on the host
// (awq.Inputs, the pure-Go searches) or on the GPU (awq.DeviceInputs, awq.GPUSearch).
type groupInputs interface {
	rows() int
	meanAbs() ([]float32, error)
	searchScale(mean []float32, ls []awq.Linear, opt awq.Options) (awq.ScaleResult, error)
	divide(s []float32) error
	searchClip(l awq.Linear, opt awq.Options) (awq.ClipResult, error)
}

type hostInputs struct{ *awq.Inputs }

func (h hostInputs) rows() int { return h.Rows }

func (h hostInputs) meanAbs() ([]float32, error) { return h.MeanAbs(), nil }

func (h hostInputs) searchScale(mean []float32, ls []awq.Linear, opt awq.Options) (awq.ScaleResult, error) {
	return awq.SearchScale(h.X, h.Rows, mean, ls, opt)
}

func (h hostInputs) divide(s []float32) error {
	h.Divide(s)
	return nil
}

func (h hostInputs) searchClip(l awq.Linear, opt awq.Options) (awq.ClipResult, error) {
	return awq.SearchClip(h.X, h.Rows, l, opt)
}

type deviceInputs struct {
	in    *awq.DeviceInputs
	g     *awq.GPUSearch
	shard int // the GPU whose engine and search these are
}

func (d deviceInputs) rows() int { return d.in.Rows }

func (d deviceInputs) meanAbs() ([]float32, error) { return d.in.MeanAbs() }

func (d deviceInputs) searchScale(mean []float32, ls []awq.Linear, opt awq.Options) (awq.ScaleResult, error) {
	return d.g.SearchScale(d.in.X, d.in.Rows, mean, ls, opt)
}

func (d deviceInputs) divide(s []float32) error {
	return d.g.DivideColumns(d.in.X, d.in.Rows, d.in.Cols, s)
}

func (d deviceInputs) searchClip(l awq.Linear, opt awq.Options) (awq.ClipResult, error) {
	return d.g.SearchClip(d.in.X, d.in.Rows, l, opt)
}
