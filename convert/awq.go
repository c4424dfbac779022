package convert

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/qpack-dev/qpack/awq"
	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
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

	gpu      *awq.GPUSearch                    // nil: the searches run on the CPU
	gpuInput map[model.Group]*awq.DeviceInputs // the GPU's inputs of each group, reused block after block
	folding  map[int]chan struct{}             // awq+gptq on the GPU: closed when the host has folded the block's scales in

	search, clip, quantize time.Duration
}

// useAWQ turns the runner into an AWQ runner: on the GPU when g is not nil (the forward passes
// and both searches; under awq+gptq also GPTQ's Hessians and solver), else on the CPU.
func useAWQ(r *blockRunner, items []Item, opt Options, g *gpu) error {
	s := &awqScaler{r: r, opt: awq.Options{Duo: opt.AWQ.Duo}, gptq: opt.Method.Solves(), noClip: opt.AWQ.NoClip, tokens: opt.AWQ.SearchTokens,
		inputs: map[string]groupInputs{}, scaled: map[int]bool{}, kept: map[string]bool{}, gpuInput: map[model.Group]*awq.DeviceInputs{},
		folding: map[int]chan struct{}{}}
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
	if s.gptq { // AWQ's searches, and so its calibration, run on the first GPU
		if err := r.useGPUs(g.devs[:1]); err != nil {
			return err
		}
	} else {
		r.dev, r.devs, r.device = g.dev, g.devs[:1], DeviceCUDA
	}
	for _, it := range items {
		if it.Scheme != nil && it.Scheme.Grid == quant.IQuant {
			return nil // the GPU searches fake-quantize to integer grids: IQ types search on the CPU
		}
	}
	var err error
	if s.gpu, err = awq.NewGPUSearch(g.dev); err == nil {
		s.gpu.Math = awqSearchMath(opt.CalibMath)
	}
	return err
}

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
	if s.gpu == nil {
		return ""
	}
	return fmt.Sprintf("; peak GPU memory in use %.2f GB", float64(s.r.gpuPeak)/1e9)
}

// close releases the GPU search and its inputs.
func (s *awqScaler) close() {
	for _, in := range s.gpuInput {
		in.Free()
	}
	if s.gpu != nil {
		s.gpu.Close()
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
	s.stride = stride
	start := time.Now()
	var err error
	if s.gpu != nil {
		err = s.r.calibrateOnGPU(m, seqs, s, opt)
	} else {
		err = model.Calibrate(m, seqs, s, opt)
	}
	if err != nil {
		return err
	}
	all := time.Since(start)
	s.r.logf("awq on %s: %d×%d calibration tokens (%d in the α search), %.1f s: scale search %.1f s, clipping search %.1f s, quantization %.1f s, forward passes and the rest %.1f s%s\n",
		s.r.device, len(seqs), len(seqs[0]), (total+stride-1)/stride, all.Seconds(), s.search.Seconds(), s.clip.Seconds(), s.quantize.Seconds(),
		(all - s.search - s.clip - s.quantize).Seconds(), s.peakNote())
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
	if s.gptq && s.scaled[block] {
		return s.r.ObserveGPU(block, g, x, rows, cols)
	}
	if s.r.stopped.Load() {
		return fmt.Errorf("stopped")
	}
	key := hessianKey(block, g)
	in, _ := s.inputs[key].(deviceInputs)
	if in.in == nil {
		var err error
		if in, err = s.deviceInputs(g, cols); err != nil {
			return fmt.Errorf("block %d, input of %s: %w", block, strings.Join(g.Modules(), ", "), err)
		}
		s.inputs[key] = in
		s.r.experts.start(block, g)
	}
	s.r.experts.add(block, g, rows)
	return in.in.Add(s.r.gpu.first(), s.gpu, x, rows)
}

// deviceInputs returns group g's device inputs, emptied for a new block.
func (s *awqScaler) deviceInputs(g model.Group, cols int) (deviceInputs, error) {
	in := s.gpuInput[g]
	if in != nil && in.Cols != cols {
		in.Free()
		in = nil
	}
	if in == nil {
		var err error
		if in, err = awq.NewDeviceInputs(s.r.dev, cols, s.stride, s.total); err != nil {
			return deviceInputs{}, err
		}
		s.gpuInput[g] = in
	}
	return deviceInputs{in, s.gpu}, in.Reset()
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
	if s.gpu != nil {
		if err := s.r.gpu.first().Synchronize(); err != nil { // the inputs are gathered
			return err
		}
		// The next block's pass overwrites the inputs: the searches must be done with them.
		defer s.gpu.Synchronize()
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
	for _, g := range b.Groups() {
		delete(s.inputs, hessianKey(b.Index, g))
	}
}

// scaleBlock searches every pair's scale on the block as loaded, then folds them all in, and
// divides the kept inputs by them for the clipping search.
func (s *awqScaler) scaleBlock(b *model.Block) error {
	start := time.Now()
	defer func() { s.search += time.Since(start) }()
	pairs := awq.Pairs(b)
	scales := make([][]float32, len(pairs))
	for i, p := range pairs {
		var ls []awq.Linear
		var block []*model.Linear
		for _, g := range p.Groups() {
			ls, block = append(ls, s.linears(b, g)...), append(block, b.Linears(g)...)
		}
		if !anyPlanned(ls) {
			continue
		}
		s.onGPU(block, ls)
		in := s.inputs[hessianKey(b.Index, p.Group)]
		if in == nil || in.rows() == 0 {
			return fmt.Errorf("block %d: no calibration inputs reached %s", b.Index, p.Group)
		}
		mean, err := in.meanAbs()
		if err != nil {
			return fmt.Errorf("block %d, input of %s: %w", b.Index, strings.Join(p.Group.Modules(), ", "), err)
		}
		res, err := in.searchScale(mean, ls, s.opt)
		if err != nil {
			return fmt.Errorf("block %d, %s: %w", b.Index, p.Group, err)
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

// awqFoldOnGPU lets awq+gptq fold a dense block's scales into the GPU engine's copy of its
// weights (tests turn it off to compare with the host's fold and upload).
var awqFoldOnGPU = true

// foldOnGPU folds the scales into the engine's copy of a dense block under awq+gptq, where the
// host's weights are only needed again by GPTQ's step after the next observing pass: the host
// folds its copy meanwhile (s.folding[b] closes when it is done, the block's kept tensors
// delivered), and the folded weights are not uploaded again. It reports whether it did.
func (s *awqScaler) foldOnGPU(b *model.Block, pairs []awq.Pair, scales [][]float32) (bool, error) {
	if !awqFoldOnGPU || s.gpu == nil || !s.gptq || b.MoE != nil {
		return false, nil
	}
	e := s.r.gpu.first()
	for i, p := range pairs {
		if scales[i] != nil {
			if err := awq.FoldOnGPU(e, b, p, scales[i]); err != nil {
				return false, fmt.Errorf("block %d: folding AWQ's scales on the GPU: %w", b.Index, err)
			}
		}
	}
	if err := e.KeepDeviceWeights(); err != nil {
		return false, err
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

// onGPU points each linear at the engine's copy of its weights, when the block runs on the GPU
// and has not been changed since it was uploaded (before any scale is folded).
func (s *awqScaler) onGPU(block []*model.Linear, ls []awq.Linear) {
	if s.gpu == nil {
		return
	}
	for i, l := range block { // ls was made from block, in its order
		ls[i].OnGPU, _ = s.r.gpu.first().LinearWeights(l)
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
// planned linear of the scaled block, puts the dequantized weights back and delivers them. An
// expert calibrated on every token clips its gate/up on every token's inputs.
func (s *awqScaler) quantizeBlock(b *model.Block) error {
	for _, g := range b.Groups() {
		in := s.inputs[hessianKey(b.Index, s.r.experts.source(b.Index, g))]
		for _, l := range s.linears(b, g) {
			if l.Scheme == nil {
				continue
			}
			if err := s.quantizeLinear(b, l, in); err != nil {
				err = fmt.Errorf("tensor %s.weight: %w", l.Name, err)
				s.r.results[l.Name] <- gptqResult{err: err}
				return err
			}
		}
	}
	return nil
}

func (s *awqScaler) quantizeLinear(b *model.Block, l awq.Linear, in groupInputs) error {
	line := fmt.Sprintf("awq %s %s", l.Name, l.Scheme)
	isQK := strings.HasSuffix(l.Name, ".q_proj") || strings.HasSuffix(l.Name, ".k_proj")
	if !s.noClip && !isQK && in != nil && in.rows() > 0 {
		start := time.Now()
		res, err := in.searchClip(l, s.opt)
		if err != nil {
			return err
		}
		s.clip += time.Since(start)
		line += fmt.Sprintf(": clipped %d groups, group output error %.4g → %.4g", res.Clipped, res.Err0, res.Err)
	}
	start := time.Now()
	t, err := blockwise.Quantize(l.W, l.Out, l.In, *l.Scheme, blockwise.Options{})
	if err != nil {
		return err
	}
	ml, err := b.Linear(l.Name)
	if err != nil {
		return err
	}
	if err := ml.SetWeight(t.Dequantize(ml.W)); err != nil { // in place: the scaled W is no longer needed
		return err
	}
	s.quantize += time.Since(start)
	s.r.logf("%s, %.0fms\n", line, 1000*time.Since(start).Seconds())
	s.r.results[l.Name] <- gptqResult{t: t}
	return nil
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
	in *awq.DeviceInputs
	g  *awq.GPUSearch
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
