// Package convert runs qpack's pipeline: open a checkpoint, choose a scheme per tensor,
// quantize, pack into an output layout, and stream the result to a new checkpoint directory
// that appears only when it is complete.
package convert

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/gptq"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// Options say how to convert. Start from DefaultOptions.
type Options struct {
	// Method quantizes the planned tensors; start from its DefaultOptions for its defaults.
	Method Method
	Format string // output layout: a packing registry name
	Clip   bool   // MSE-optimal clipping search per group (rtn; gptq's mse option)
	// Imatrix fits every integer/NF4 group with the importance-weighted scale search
	// (blockwise.Options.Imatrix): the parameters minimising Σ E[x_k²]·(w_k − ŵ_k)², E[x²]
	// from the calibration data for RTN (which then needs Calib) and diag H inside GPTQ. The
	// allocator's sensitivity is then measured with the same search. On the GPU: the search of
	// integer grids and the fit of k-quants.
	Imatrix bool
	// importance is each module's E[x²] per input channel when Imatrix is used with RTN;
	// Convert measures it unless it is set (tests give two conversions the same one).
	importance map[string][]float32
	// ImatrixFile, when set, is llama.cpp's importance matrix (llama-imatrix's output) to use
	// as importance instead of measuring one; it implies Imatrix.
	ImatrixFile string
	// globals is the global scale of each NVFP4 module that shares one with the linears fused
	// with it (sharedGlobalScales); a module not in it computes its own.
	globals map[string]float32
	// GPTQ tunes --method gptq, which needs Calib.
	GPTQ GPTQOptions
	// AWQ tunes --method awq and awq+gptq, which need Calib.
	AWQ AWQOptions
	// Experts says how a mixture of experts' experts are calibrated.
	Experts ExpertOptions
	// Alloc says how the allocator chooses each tensor's scheme (strategy, ladder, overrides,
	// budget, whether embeddings and lm_head are candidates).
	Alloc alloc.Options
	// OutputProbe weighs a budget plan's measurements with calibration by each linear's
	// measured cost to the model's output (outputCoefficients). On in DefaultOptions.
	OutputProbe bool
	// Calib, when its File is set, runs the model over calibration data; the allocator then
	// measures sensitivity as the activation-weighted error instead of the weight error.
	Calib CalibOptions
	// Plan, when set, is replayed exactly instead of planning (from `qpack plan --json`).
	Plan *alloc.Plan
	// Device is where block-wise quantization runs: DeviceAuto (default), DeviceCPU or DeviceCUDA.
	Device string
	// Devices are the GPUs' ordinals, when Device lets the conversion use GPUs: GPTQ, AWQ and
	// awq+gptq calibrate on all of them (data-parallel; AWQ of a mixture of experts or IQ types on
	// the first), the plan's statistics pass and output probe run on all of them, RTN on the
	// first; nil means every GPU the driver sees.
	Devices []int
	// CalibMath is how the GPU rounds the operands of the calibration's GEMMs (GPTQ's and AWQ's
	// forward passes and Gram matrices, the plan's statistics and output probe): CalibF16
	// (default, also ""), CalibTF32, CalibBF16, CalibGramBF16 or CalibFP32.
	CalibMath string
	// GPUSlots is how many tensors are on the GPU at once (read, quantized, written back);
	// 0 means DefaultGPUSlots.
	GPUSlots int
	// MeasureError computes each quantized weight's relative error ‖W − Ŵ‖/‖W‖ for the log and
	// the report; it costs a dequantization per tensor on the CPU.
	MeasureError bool
	// MaxShardSize splits the output into shards of at most this many bytes; 0 keeps the
	// input's sharding (one output shard per input shard).
	MaxShardSize int64
	// Overwrite allows replacing an existing output directory.
	Overwrite bool
	// InputHash is the digest of each input file the provenance records: HashBLAKE3 (the
	// default when empty), HashSHA256 or HashNone.
	InputHash string
	// Sync flushes the output files to disk before they are renamed into place, so that a
	// power loss right after the conversion cannot leave a file with missing data; it starts
	// each tensor's writeback as soon as it is written (a GGUF file is flushed once, at the end),
	// so the conversion then runs at about the disk's write speed. Without it the output still appears only when complete, so a failed
	// or killed conversion leaves nothing that looks finished.
	Sync bool
	// Log receives one line per tensor; nil discards.
	Log io.Writer
	// Progress, when set, is told of each tensor written (a progress bar; see ProgressFunc).
	Progress ProgressFunc
	// Context, when set, stops the conversion when it is cancelled: no tensor starts after
	// that, Convert returns the context's error and the staging directory is removed.
	Context context.Context
	// Version is recorded in the output's provenance.
	Version string
	// Calibrations, when set, shares loaded calibration data with other conversions.
	Calibrations *CalibrationCache
	// GGUF says how --format gguf writes its file (preset, token_embd's and output's types).
	GGUF GGUFOptions
	// gguf is the GGUF layout and per-tensor types once the checkpoint is open.
	gguf *ggufPlan
}

// DefaultScheme is the interoperable default: 4-bit, group 128, symmetric (docs/reference/formats.md §7).
var DefaultScheme = quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}

// DefaultOptions: RTN with the default scheme on every decoder linear, GPTQ layout. Another
// method's defaults are its DefaultOptions (GPTQ.DefaultOptions(), ...).
func DefaultOptions() Options {
	return Options{Method: RTN, Format: "gptq", Alloc: Uniform(DefaultScheme), GPTQ: GPTQOptions{TrueSequential: true}, OutputProbe: true}
}

// Uniform is the allocator setting that gives every candidate tensor scheme s.
func Uniform(s quant.Scheme) alloc.Options {
	return alloc.Options{Strategy: alloc.StrategyUniform, Ladder: []alloc.Choice{alloc.SchemeChoice(s)}}
}

// check is the one validation step before any work (Convert and Plan run it first): it
// resolves the format and the ladder, and refuses before anything is read what the method, the
// format and the allocator settings cannot do together (checkCandidates).
func (o *Options) check() (packing.Format, error) {
	if _, err := ParseMethod(string(o.Method)); err != nil {
		return nil, err
	}
	if o.ImatrixFile != "" {
		o.Imatrix = true
	}
	switch {
	case o.Method.Calibrates() && o.Calib.File == "":
		return nil, fmt.Errorf("--method %s needs calibration data (--calib FILE)", o.Method)
	case o.Imatrix && !o.Method.Calibrates() && o.Calib.File == "" && o.importance == nil && o.ImatrixFile == "":
		return nil, fmt.Errorf("--imatrix needs calibration data (--calib FILE) for the importance E[x²]")
	}
	f, err := lookupFormat(o.Format)
	if err != nil {
		return nil, err
	}
	if err := o.checkGGUF(f); err != nil {
		return nil, err
	}
	if o.InputHash == "" {
		o.InputHash = HashBLAKE3
	}
	if err := checkInputHash(o.InputHash); err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Plan == nil && len(o.Alloc.Ladder) == 0 {
		o.Alloc.Ladder = o.defaultLadder(f)
	}
	return f, o.checkCandidates(f)
}

// defaultLadder is the ladder when none is given: a budget plan in a format that holds mixed
// schemes chooses among alloc.QPackLadder's rungs that the method can produce with these
// options; otherwise the allocator's default for the strategy.
func (o *Options) defaultLadder(f packing.Format) []alloc.Choice {
	if isGGUF(f) {
		return o.ggufLadder()
	}
	if o.Alloc.Strategy != alloc.StrategyBudget || !f.MixedSchemes() {
		return alloc.DefaultLadder(o.Alloc.Strategy)
	}
	var ladder []alloc.Choice
	for _, c := range alloc.QPackLadder() {
		if c.Keep || o.Method.Takes(c.Scheme, *o) == nil {
			ladder = append(ladder, c)
		}
	}
	return ladder
}

// checkCandidates refuses, before any work, plans the method or the format could not carry
// out: a scheme the plan may choose (a ladder rung, an override, a replayed plan's entry) that
// the method cannot produce, embeddings or lm_head under a method that quantizes decoder
// linears only, and several schemes in a format whose config holds one.
func (o *Options) checkCandidates(f packing.Format) error {
	var schemes []quant.Scheme
	where := map[quant.Scheme]string{}
	add := func(s quant.Scheme, w string) {
		if _, seen := where[s]; !seen {
			schemes = append(schemes, s)
			where[s] = w
		}
	}
	if o.Plan != nil {
		for _, e := range o.Plan.Entries {
			if c, err := e.Choice(); err == nil && !c.Keep {
				add(c.Scheme, "the plan's tensor "+e.Name)
			}
		}
	} else {
		rung := "the ladder's rung"
		if len(o.Alloc.Ladder) == 1 {
			rung = "scheme"
		}
		for _, c := range o.Alloc.Ladder {
			if !c.Keep {
				add(c.Scheme, rung)
			}
		}
		for _, ov := range o.Alloc.Overrides {
			if !ov.Choice.Keep {
				add(ov.Choice.Scheme, "the override "+ov.Pattern+"=")
			}
		}
	}
	for _, s := range schemes {
		if err := o.Method.Takes(s, *o); err != nil {
			return fmt.Errorf("%s %s: %w", where[s], s, err)
		}
	}
	if o.Method.Calibrates() && o.Plan == nil && (o.Alloc.QuantizeEmbeddings || o.Alloc.QuantizeHead) {
		return fmt.Errorf("%s quantizes decoder linears only: drop --quantize-embeddings/--quantize-head, or use --method rtn", o.Method)
	}
	if len(schemes) > 1 && !f.MixedSchemes() {
		names := make([]string, len(schemes))
		for i, s := range schemes {
			names[i] = s.String()
		}
		return fmt.Errorf("this plan can give tensors different schemes (%s), which the %s format's single quantization config cannot describe: use --format qpack, or one scheme (with keep) in --ladder and --override",
			strings.Join(names, ", "), f.Name())
	}
	return nil
}

// loadImatrixFile reads ImatrixFile, when given, as the importance of ck's linears.
func (o *Options) loadImatrixFile(ck *safetensors.Checkpoint) error {
	if o.ImatrixFile == "" {
		return nil
	}
	inputs := map[string]int{}
	for _, name := range ck.Names() {
		if info, _ := ck.Info(name); len(info.Shape) == 2 {
			inputs[strings.TrimSuffix(name, ".weight")] = info.Shape[1]
		}
	}
	var err error
	o.importance, err = readImatrixFile(o.ImatrixFile, ck.Dir, inputs)
	return err
}

// gptq is the GPTQ solver's options for these settings.
func (o *Options) gptq() gptq.Options {
	return gptq.Options{Damp: o.GPTQ.Damp, ActOrder: o.GPTQ.ActOrder, StaticGroups: o.GPTQ.StaticGroups,
		Clip: o.Clip, Imatrix: o.Imatrix, BaselineLoss: true}
}

// blockwise returns the RTN options for module (its importance when Imatrix).
func (o *Options) blockwise(module string) blockwise.Options {
	b := blockwise.Options{Clip: o.Clip, Imatrix: o.Imatrix, GlobalScale: o.globals[module]}
	if o.Imatrix {
		b.Importance = o.importance[module]
	}
	return b
}

// calibration loads the calibration data when a file was given.
func (o *Options) calibration(src string) (*Calibration, error) {
	if o.Calib.File == "" {
		return nil, nil
	}
	if o.Calibrations != nil {
		return o.Calibrations.load(src, o.Calib)
	}
	return loadCalibration(src, o.Calib)
}
