package convert

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
	"github.com/qpack-dev/qpack/safetensors"
)

// Item is one input tensor and what happens to it.
type Item struct {
	Info     safetensors.TensorInfo
	Role     model.Role
	Module   string        // module prefix of a quantized weight
	Scheme   *quant.Scheme // nil: kept as is
	ShardIdx int           // input shard
}

// N and K are the output and input dimensions of a 2-D weight.
func (it Item) N() int { return it.Info.Shape[0] }
func (it Item) K() int { return it.Info.Shape[1] }

// Plan chooses a scheme for every tensor of the checkpoint at src without writing anything:
// what `qpack plan` shows and what Convert carries out.
func Plan(src string, opt Options) (*alloc.Plan, error) {
	f, err := opt.check()
	if err != nil {
		return nil, err
	}
	ck, err := quantized.OpenSource(src)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	if err := opt.loadImatrixFile(ck); err != nil {
		return nil, err
	}
	if isGGUF(f) {
		if opt.gguf, err = prepareGGUF(ck, &opt); err != nil {
			return nil, err
		}
	}
	calib, err := opt.calibration(ck.Dir)
	if err != nil {
		return nil, err
	}
	defer closeDevices(holdGPUs(opt, calib)) // the statistics pass and the probe make each context once
	return makePlan(ck, opt, f, calib)
}

// makePlan runs the allocator (or validates a replayed plan) over the checkpoint's tensors.
// Sensitivity is the relative error energy of RTN: with calibration data the diagonal form of
// tr(ΔW H ΔWᵀ)/tr(W H Wᵀ), H's diagonal being each input channel's mean x²; without it
// ‖W − Ŵ‖²/‖W‖², the same with H = I.
func makePlan(ck *safetensors.Checkpoint, opt Options, f packing.Format, calib *Calibration) (*alloc.Plan, error) {
	descs, err := describe(ck)
	if err != nil {
		return nil, err
	}
	if opt.gguf != nil {
		opt.gguf.storedBytes(descs)
	}
	if opt.Plan != nil {
		if err := opt.Plan.Validate(descs, f.Supports); err != nil {
			return nil, err
		}
		return opt.Plan, nil
	}
	if err := checkUniformScheme(descs, opt.Alloc, f); err != nil {
		return nil, err
	}
	importance := opt.importance
	var meanAbs map[string][]float32
	if importance == nil && calib != nil && needsMeasurement(opt.Alloc) {
		logf := func(format string, args ...any) { fmt.Fprintf(opt.Log, format, args...) }
		if importance, meanAbs, err = measureImportance(opt.context(), ck.Dir, calib, opt.Device, opt.Devices, opt.CalibMath, opt.Experts, logf); err != nil {
			return nil, err
		}
	}
	var alpha map[string]float64 // per module; nil: every tensor's relative error counts alike
	if calib != nil && opt.Alloc.Strategy == alloc.StrategyBudget && opt.OutputProbe {
		logf := func(format string, args ...any) { fmt.Fprintf(opt.Log, format, args...) }
		if alpha, err = outputCoefficients(opt.context(), ck.Dir, calib, importance, opt.Device, opt.Devices, opt.CalibMath, logf); err != nil {
			return nil, err
		}
	}
	otherAlpha := medianCoefficient(alpha)
	samples := &sampleCache{ck: ck, linears: countLinears(descs), progress: opt.Progress,
		m: map[string]*weightSample{}, seen: map[string]bool{}}
	measure := func(t alloc.TensorDesc, s quant.Scheme) (float64, error) {
		if err := opt.context().Err(); err != nil {
			return 0, err
		}
		sample, err := samples.get(t.Name)
		if err != nil {
			return 0, err
		}
		imp := importance[model.ParseTensorName(t.Name).Module]
		if opt.Method.Scales() {
			imp = sample.awqScaled(meanAbs[model.ParseTensorName(t.Name).Module], imp)
		}
		bopt := blockwise.Options{Clip: opt.Clip, Imatrix: opt.Imatrix}
		if opt.Imatrix {
			bopt.Importance = imp
		}
		e, err := sample.relativeError(s, bopt, imp)
		if alpha == nil {
			return e * e, err
		}
		a, ok := alpha[model.ParseTensorName(t.Name).Module]
		if !ok {
			a = otherAlpha
		}
		return a * e * e, err
	}
	planner, err := alloc.NewPlanner(descs, f.Bytes, f.Supports, measure)
	if err != nil {
		return nil, err
	}
	plan, err := planner.Plan(opt.Alloc)
	if err == nil && opt.gguf != nil {
		opt.gguf.annotate(plan, descs)
	}
	return plan, err
}

// checkUniformScheme names the tensors a uniform scheme the format cannot hold would apply to,
// so the refusal says what it is about.
func checkUniformScheme(descs []alloc.TensorDesc, a alloc.Options, f packing.Format) error {
	if a.Strategy != alloc.StrategyUniform || len(a.Ladder) != 1 || a.Ladder[0].Keep {
		return nil
	}
	err := f.Supports(a.Ladder[0].Scheme)
	if err == nil {
		return nil
	}
	var linears []string
	for _, d := range descs {
		if d.Role.IsLinear() {
			linears = append(linears, d.Name)
		}
	}
	if len(linears) == 0 {
		return err
	}
	return fmt.Errorf("tensor %s (and %d more): %w", linears[0], len(linears)-1, err)
}

func describe(ck *safetensors.Checkpoint) ([]alloc.TensorDesc, error) {
	var infos []alloc.TensorInfo
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		infos = append(infos, alloc.TensorInfo{Name: name, Shape: info.Shape, DType: string(info.DType)})
	}
	return alloc.Describe(infos)
}

// needsMeasurement says whether the strategy measures sensitivity.
func needsMeasurement(a alloc.Options) bool { return a.Strategy != alloc.StrategyUniform }

// sensitivityRows is how many rows of a weight the allocator quantizes to measure its
// sensitivity. RTN treats rows independently, so the error energy ratio of evenly spaced rows
// estimates the whole tensor's, and a 7B-scale plan reads megabytes instead of the checkpoint.
const sensitivityRows = 32

// weightSample holds rows of one weight for measuring its sensitivity.
type weightSample struct {
	name    string
	w       []float32
	rows, k int
	scaled  bool // columns scaled by AWQ's planning scale (awqScaled)
}

// sampleCache holds the weight samples of the tensors being measured: the budget planner
// measures several tensors at once, each tensor's rungs one after another. A sample evicted
// while its tensor is still being measured is read again, so the bound costs no correctness.
type sampleCache struct {
	ck       *safetensors.Checkpoint
	linears  int
	progress ProgressFunc
	mu       sync.Mutex
	m        map[string]*weightSample
	seen     map[string]bool // tensors read so far, for the progress count
}

func (c *sampleCache) get(name string) (*weightSample, error) {
	c.mu.Lock()
	ws := c.m[name]
	c.mu.Unlock()
	if ws != nil {
		return ws, nil
	}
	ws = &weightSample{}
	if err := ws.read(c.ck, name, sensitivityRows); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= 4*runtime.GOMAXPROCS(0) {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[name] = ws
	if !c.seen[name] {
		c.seen[name] = true
		if c.progress != nil {
			c.progress(len(c.seen), max(len(c.seen), c.linears), 0, 0)
		}
	}
	return ws, nil
}

// relativeError quantizes the sample with RTN and returns ‖W − Ŵ‖/‖W‖, each input channel k
// weighted by importance[k] when given.
func (ws *weightSample) relativeError(s quant.Scheme, bopt blockwise.Options, importance []float32) (float64, error) {
	t, err := blockwise.Quantize(ws.w, ws.rows, ws.k, s, bopt)
	if err != nil {
		return 0, fmt.Errorf("tensor %s: %w", ws.name, err)
	}
	if importance != nil {
		return quant.WeightedRelativeError(ws.w, t.Dequantize(nil), t.N, t.K, importance), nil
	}
	return quant.RelativeError(ws.w, t.Dequantize(nil)), nil
}

// read decodes about max rows of a 2-D tensor, in a few evenly spaced runs of consecutive
// rows (all rows when it has no more), touching only their bytes.
func (ws *weightSample) read(ck *safetensors.Checkpoint, name string, max int) error {
	info, _ := ck.Info(name)
	n, k := info.Shape[0], info.Shape[1]
	*ws = weightSample{name: name, rows: n, k: k}
	if n <= max {
		var err error
		ws.w, err = ck.Float32(name)
		return err
	}
	raw, err := ck.Bytes(name)
	if err != nil {
		return err
	}
	// sampleChunks runs of consecutive rows, evenly spaced: few, sequential reads.
	const sampleChunks = 4
	rowBytes := len(raw) / n
	per := max / sampleChunks
	ws.rows = sampleChunks * per
	ws.w = make([]float32, ws.rows*k)
	for c := range sampleChunks {
		r := c * n / sampleChunks
		dst := ws.w[c*per*k : (c+1)*per*k]
		if err := safetensors.DecodeFloat32(info.DType, dst, raw[r*rowBytes:(r+per)*rowBytes]); err != nil {
			return fmt.Errorf("tensor %s: %w", name, err)
		}
	}
	return nil
}

// planItems lists every tensor in file order with its planned scheme.
func planItems(ck *safetensors.Checkpoint, plan *alloc.Plan) ([]Item, error) {
	shardOf := map[string]int{}
	for i, p := range ck.Files() {
		shardOf[p] = i
	}
	listed := map[string]bool{} // a block FP8 input's scales are read with their weights (quantized.OpenSource)
	for _, name := range ck.Names() {
		listed[name] = true
	}
	var items []Item
	for _, h := range ck.Headers() {
		for _, stored := range h.Tensors { // file order, so output mirrors input
			if !listed[stored.Name] {
				continue
			}
			info, _ := ck.Info(stored.Name) // as read: a virtual tensor's dtype and size
			tn := model.ParseTensorName(info.Name)
			it := Item{Info: info, Role: tn.Role, Module: tn.Module, ShardIdx: shardOf[info.File]}
			e, ok := plan.Lookup(info.Name)
			if !ok {
				return nil, fmt.Errorf("the plan has no entry for tensor %s", info.Name)
			}
			c, err := e.Choice()
			if err != nil {
				return nil, err
			}
			if !c.Keep {
				s := c.Scheme
				it.Scheme = &s
			}
			items = append(items, it)
		}
	}
	return items, nil
}

// mainScheme is the scheme that covers the most quantized parameters (ties: by name), which
// a format's single quantization config records; ok is false when nothing is quantized.
func mainScheme(items []Item) (s quant.Scheme, mixed, ok bool) {
	params := map[quant.Scheme]int64{}
	for _, it := range items {
		if it.Scheme != nil {
			params[*it.Scheme] += int64(it.N()) * int64(it.K())
		}
	}
	if len(params) == 0 {
		return quant.Scheme{}, false, false
	}
	schemes := make([]quant.Scheme, 0, len(params))
	for k := range params {
		schemes = append(schemes, k)
	}
	sort.Slice(schemes, func(a, b int) bool {
		if params[schemes[a]] != params[schemes[b]] {
			return params[schemes[a]] > params[schemes[b]]
		}
		return schemes[a].String() < schemes[b].String()
	})
	return schemes[0], len(schemes) > 1, true
}

// checkQuantizes refuses a plan that keeps every tensor: its output would be the input again,
// without a quantization config, which no loader of the format reads as one of its checkpoints.
func checkQuantizes(items []Item, plan *alloc.Plan) error {
	if _, _, any := mainScheme(items); any {
		return nil
	}
	why := "every tensor is kept (check --override and the ladder)"
	if len(plan.Warnings) > 0 {
		why += "; " + strings.Join(plan.Warnings, "; ")
	}
	return fmt.Errorf("nothing to quantize: %s", why)
}

// checkMixed refuses a plan with several schemes for a format whose config holds only one.
func checkMixed(items []Item, f packing.Format) error {
	main, mixed, _ := mainScheme(items)
	if !mixed || f.MixedSchemes() {
		return nil
	}
	for _, it := range items {
		if it.Scheme != nil && *it.Scheme != main {
			return fmt.Errorf("tensor %s: the plan mixes schemes (%s here, %s elsewhere), which the %s format's single quantization config cannot describe; use --format qpack",
				it.Info.Name, it.Scheme, main, f.Name())
		}
	}
	return nil
}
