// Package convert runs qpack's pipeline: open a checkpoint, choose a scheme per tensor,
// quantize, pack into an output layout, and stream the result to a new checkpoint directory
// that appears only when it is complete.
package convert

import (
	"context"
	"fmt"
	"io"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// Options say how to convert. Start from DefaultOptions.
type Options struct {
	Method string // "rtn", "gptq", "awq" or "awq+gptq"
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
	// GPTQ tunes --method gptq, which needs Calib.
	GPTQ GPTQOptions
	// AWQ tunes --method awq and awq+gptq, which need Calib.
	AWQ AWQOptions
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
	// each tensor's writeback as soon as it is written, so the conversion then runs at about the
	// disk's write speed. Without it the output still appears only when complete, so a failed
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
}

// DefaultScheme is the interoperable default: 4-bit, group 128, symmetric (docs/reference/formats.md §7).
var DefaultScheme = quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}

// DefaultOptions: RTN with the default scheme on every decoder linear, GPTQ layout.
func DefaultOptions() Options {
	return Options{Method: "rtn", Format: "gptq", Alloc: Uniform(DefaultScheme), GPTQ: GPTQOptions{TrueSequential: true}, OutputProbe: true}
}

// Uniform is the allocator setting that gives every candidate tensor scheme s.
func Uniform(s quant.Scheme) alloc.Options {
	return alloc.Options{Strategy: alloc.StrategyUniform, Ladder: []alloc.Choice{alloc.SchemeChoice(s)}}
}

func (o *Options) validate() (packing.Format, error) {
	switch o.Method {
	case "rtn":
		if o.Imatrix && o.Calib.File == "" {
			return nil, fmt.Errorf("--imatrix needs calibration data (--calib FILE) for the importance E[x²]")
		}
	case "gptq", "awq", "awq+gptq":
		if o.Calib.File == "" {
			return nil, fmt.Errorf("--method %s needs calibration data (--calib FILE)", o.Method)
		}
	default:
		return nil, fmt.Errorf("method %q is not available (available: rtn, gptq, awq, awq+gptq)", o.Method)
	}
	f, err := packing.Lookup(o.Format)
	if err != nil {
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
	return f, nil
}

// blockwise returns the RTN options for module (its importance when Imatrix).
func (o *Options) blockwise(module string) blockwise.Options {
	b := blockwise.Options{Clip: o.Clip, Imatrix: o.Imatrix}
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
