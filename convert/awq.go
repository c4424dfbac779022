package convert

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/qpack-dev/qpack/awq"
	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/model"
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

func isAWQ(method string) bool { return method == "awq" || method == "awq+gptq" }

// awqScaler runs AWQ inside a block-by-block calibration (model.Calibrate): for each block it
// gathers every group's inputs with the block as loaded, searches the four scales, folds them
// into the block, then either clips and quantizes (awq) or lets GPTQ quantize the scaled block
// (awq+gptq: GPTQ's Hessians are gathered on the scaled inputs). The dequantized weights are
// put back, so the next block's inputs come from the quantized block, as in GPTQ's pipeline:
// AutoAWQ feeds the next block from the unquantized one, but propagating the error lets each
// block's search see the inputs it will see at inference, and awq+gptq needs it anyway.
type awqScaler struct {
	r      *gptqRunner // delivers results, holds the plan; quantizes with GPTQ under awq+gptq
	opt    awq.Options
	gptq   bool
	noClip bool
	tokens int // search tokens
	stride int // every stride-th calibration token is kept for the searches
	inputs map[string]*awq.Inputs
	scaled map[int]bool    // awq+gptq: blocks already scaled, now in GPTQ's steps
	kept   map[string]bool // unquantized block tensors the folding may change, delivered by name

	search, clip, quantize time.Duration
}

// useAWQ turns the runner into an AWQ runner on the CPU.
func useAWQ(r *gptqRunner, items []Item, opt Options) error {
	r.device = DeviceCPU
	s := &awqScaler{r: r, opt: awq.Options{Duo: opt.AWQ.Duo}, gptq: opt.Method == "awq+gptq", noClip: opt.AWQ.NoClip, tokens: opt.AWQ.SearchTokens,
		inputs: map[string]*awq.Inputs{}, scaled: map[int]bool{}, kept: map[string]bool{}}
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
	return nil
}

// foldable says whether a block tensor is one that folding scales can change: the two norms and
// the seven linears' weights and biases.
func foldable(name string) bool {
	t := model.ParseTensorName(name)
	if t.Block < 0 || t.Expert >= 0 {
		return false
	}
	if t.Role.IsLinear() {
		return t.Param == "weight" || t.Param == "bias"
	}
	return strings.HasSuffix(name, ".input_layernorm.weight") || strings.HasSuffix(name, ".post_attention_layernorm.weight")
}

// changes says whether the kept tensor name is delivered by the calibration run.
func (r *gptqRunner) changes(name string) bool {
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
	opt.Steps = [][]model.Group{model.Groups}
	if s.gptq {
		gsteps := [][]model.Group{model.Groups}
		if opt.TrueSequential {
			gsteps = [][]model.Group{{model.GroupQKV}, {model.GroupO}, {model.GroupGateUp}, {model.GroupDown}}
		}
		opt.Steps = append(opt.Steps, gsteps...)
	}
	s.stride = stride
	start := time.Now()
	if err := model.Calibrate(m, seqs, s, opt); err != nil {
		return err
	}
	all := time.Since(start)
	s.r.logf("awq: %d×%d calibration tokens (%d in the α search), %.1f s: scale search %.1f s, clipping search %.1f s, quantization %.1f s, forward passes and the rest %.1f s\n",
		len(seqs), len(seqs[0]), (total+stride-1)/stride, all.Seconds(), s.search.Seconds(), s.clip.Seconds(), s.quantize.Seconds(),
		(all - s.search - s.clip - s.quantize).Seconds())
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
	in := s.inputs[key]
	if in == nil {
		in = &awq.Inputs{Stride: s.stride}
		s.inputs[key] = in
	}
	if err := in.Add(x, rows, cols); err != nil {
		return fmt.Errorf("input of %s: %w", strings.Join(g.Modules(), ", "), err)
	}
	return nil
}

// Update scales the block (the first call for a block), then clips and quantizes it, or under
// awq+gptq hands the later calls to GPTQ.
func (s *awqScaler) Update(b *model.Block, groups []model.Group) error {
	if s.gptq && s.scaled[b.Index] {
		return s.r.Update(b, groups)
	}
	if err := s.scaleBlock(b); err != nil {
		s.r.fail(err)
		return err
	}
	s.deliverKept(b)
	if s.gptq {
		s.scaled[b.Index] = true
		s.dropInputs(b.Index)
		return nil
	}
	err := s.quantizeBlock(b)
	s.dropInputs(b.Index)
	return err
}

func (s *awqScaler) dropInputs(block int) {
	for _, g := range model.Groups {
		delete(s.inputs, hessianKey(block, g))
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
		ls := s.linears(b, p.Group)
		if !anyPlanned(ls) {
			continue
		}
		in := s.inputs[hessianKey(b.Index, p.Group)]
		if in == nil || in.Rows == 0 {
			return fmt.Errorf("block %d: no calibration inputs reached %s", b.Index, p.Group)
		}
		res, err := awq.SearchScale(in.X, in.Rows, in.MeanAbs(), ls, s.opt)
		if err != nil {
			return fmt.Errorf("block %d, %s: %w", b.Index, p.Group, err)
		}
		scales[i] = res.Scales
		s.r.logf("awq block %d %s: α %.2f, output error %.4g (α=0: %.4g, %.1f%% lower)\n",
			b.Index, p.Group, res.Alpha, res.Loss, res.Loss0, 100*(1-res.Loss/math.Max(res.Loss0, 1e-30)))
	}
	for i, p := range pairs {
		sc := scales[i]
		if sc == nil {
			continue
		}
		awq.Fold(b, p, sc)
		s.inputs[hessianKey(b.Index, p.Group)].Divide(sc)
	}
	return nil
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

func anyPlanned(ls []awq.Linear) bool {
	for _, l := range ls {
		if l.Scheme != nil {
			return true
		}
	}
	return false
}

// quantizeBlock clips (all but q and k, whose errors meet in the q·k product) and quantizes each
// planned linear of the scaled block, puts the dequantized weights back and delivers them.
func (s *awqScaler) quantizeBlock(b *model.Block) error {
	for _, g := range model.Groups {
		in := s.inputs[hessianKey(b.Index, g)]
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

func (s *awqScaler) quantizeLinear(b *model.Block, l awq.Linear, in *awq.Inputs) error {
	line := fmt.Sprintf("awq %s %s", l.Name, l.Scheme)
	isQK := strings.HasSuffix(l.Name, ".q_proj") || strings.HasSuffix(l.Name, ".k_proj")
	if !s.noClip && !isQK && in != nil && in.Rows > 0 {
		start := time.Now()
		res, err := awq.SearchClip(in.X, in.Rows, l, s.opt)
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
	ml, err := b.Linear(l.Name[strings.LastIndexByte(l.Name, '.')+1:])
	if err != nil {
		return err
	}
	if err := ml.SetWeight(t.Dequantize(nil)); err != nil {
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
	for _, g := range model.Groups {
		for _, l := range b.Linears(g) {
			send(l.Name+".weight", l.W)
			send(l.Name+".bias", l.Bias)
		}
	}
}

// changedUnit writes a kept tensor with the values the calibration run delivers, in its dtype.
func changedUnit(r *gptqRunner, it Item, writes *writeTimer) unit {
	return func(out *safetensors.CheckpointWriter) error {
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
func (r *gptqRunner) awqPhases() []Phase {
	if r == nil || r.awq == nil {
		return nil
	}
	return []Phase{newPhase("awq scale search", r.awq.search.Seconds(), 0),
		newPhase("awq clipping search", r.awq.clip.Seconds(), 0), newPhase("awq quantization", r.awq.quantize.Seconds(), 0)}
}
