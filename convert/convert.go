package convert

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/qpack-dev/qpack/internal/staged"
	"github.com/qpack-dev/qpack/internal/timeline"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quantized"
	"github.com/qpack-dev/qpack/safetensors"
)

// TensorReport says what happened to one input tensor.
type TensorReport struct {
	Name     string   `json:"name"`
	Shape    []int    `json:"shape"`
	Scheme   string   `json:"scheme"` // "keep" for tensors copied as they are
	InBytes  int64    `json:"in_bytes"`
	OutBytes int64    `json:"out_bytes"`
	BPW      float64  `json:"bpw"`                 // stored bits per weight, parameters included
	RelError float64  `json:"rel_error,omitempty"` // ‖W − Ŵ‖/‖W‖ of a quantized weight
	Seconds  float64  `json:"seconds,omitempty"`   // quantize + pack time
	Device   string   `json:"device,omitempty"`    // where it was quantized: cpu or cuda
	Outputs  []string `json:"outputs,omitempty"`   // the stored tensors it became
}

// Report summarises a conversion; `qpack convert --report` writes it as JSON.
type Report struct {
	Source      string         `json:"source"`
	Output      string         `json:"output"`
	Method      string         `json:"method"`
	Format      string         `json:"format"`
	Tensors     []TensorReport `json:"tensors"`
	Quantized   int            `json:"quantized_tensors"`
	QuantParams int64          `json:"quantized_params"`
	QuantBytes  int64          `json:"quantized_bytes"` // stored bytes of the quantized tensors
	QuantBPW    float64        `json:"quantized_bpw"`
	InBytes     int64          `json:"in_bytes"`
	OutBytes    int64          `json:"out_bytes"`
	Compression float64        `json:"compression"` // InBytes / OutBytes
	Files       []string       `json:"files"`
	Seconds     float64        `json:"seconds"`
	// Where the time went: setting up (reading the plan, opening the GPUs, making their
	// solvers), quantizing and packing (reading the weights, and for the GPU the copies and
	// kernels), writing the output (summed over the writers), and committing it (the final
	// flush to disk and renames); hashing the inputs for the provenance runs alongside them.
	SetupSeconds    float64 `json:"setup_seconds"`
	HashSeconds     float64 `json:"hash_seconds"`
	QuantizeSeconds float64 `json:"quantize_seconds"`
	WriteSeconds    float64 `json:"write_seconds"`
	CommitSeconds   float64 `json:"commit_seconds"`
	// Breakdown splits the wall time by phase, with bytes and rates (see breakdown.go).
	Breakdown []Phase `json:"breakdown"`

	writes          writeTimer
	hashWaitSeconds float64 // waiting for the input hashes at the end
	hashedBytes     int64
}

// Convert quantizes the checkpoint at src into a new checkpoint directory dst.
func Convert(src, dst string, opt Options) (*Report, error) {
	start := time.Now()
	f, err := opt.check()
	if err != nil {
		return nil, err
	}
	if err := staged.CheckDestination(dst, opt.Overwrite); err != nil {
		return nil, err
	}
	ck, err := quantized.OpenSource(src) // a block FP8 release reads as its float weights
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	cfg, err := readModelConfig(ck.Dir, f)
	if err != nil {
		return nil, err
	}
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
	held := holdGPUs(opt, calib)
	defer closeDevices(held)
	if opt.Imatrix && !opt.Method.Calibrates() && opt.importance == nil {
		logf := func(format string, args ...any) { fmt.Fprintf(opt.Log, format, args...) }
		if opt.importance, _, err = measureImportance(opt.context(), ck.Dir, calib, opt.Device, opt.Devices, opt.CalibMath, opt.Experts, logf); err != nil {
			return nil, err
		}
	}
	endPlan := timeline.Begin(timeline.Host, "plan")
	plan, err := makePlan(ck, opt, f, calib)
	endPlan()
	if err != nil {
		return nil, err
	}
	for _, w := range plan.Warnings {
		fmt.Fprintf(opt.Log, "warning: %s\n", w)
	}
	items, err := planItems(ck, plan)
	if err != nil {
		return nil, err
	}
	if err := checkQuantizes(items, plan); err != nil {
		return nil, err
	}
	if err := checkMixed(items, f); err != nil {
		return nil, err
	}
	if opt.globals, err = sharedGlobalScales(ck, items, f); err != nil {
		return nil, err
	}
	opt.Log = &lockedWriter{w: opt.Log} // the units and the calibrating runner log from several goroutines
	opening := openModel(ck.Dir, opt.Method)
	defer opening.discard()
	endSetup := timeline.Begin(timeline.Host, "set up the method")
	g, runner, err := setupMethod(opt, items, f, opening)
	endSetup()
	closeDevices(held) // the method holds its own
	held = nil
	if err != nil {
		return nil, err
	}
	defer g.close()
	defer runner.close()
	// The calibration begins now: laying out the output and hashing the inputs need not come first
	// (on four GPUs they held its start by a tenth of a second).
	report := &Report{Source: src, Output: dst, Method: opt.Method.String(), Format: f.Name(), SetupSeconds: time.Since(start).Seconds()}
	defer runner.start(opening, calib, opt.GPTQ.TrueSequential)()
	tensors, units, err := buildOutput(ck, items, f, opt, g, runner, report)
	if err != nil {
		return nil, err
	}
	hashes, err := startHashing(ck.Files(), opt.InputHash)
	if err != nil {
		return nil, err
	}
	defer hashes.cancel()
	meta, err := outputMetadata(items, plan, calib, hashes.inputs, f, opt)
	if err != nil {
		return nil, err
	}
	if err := opt.context().Err(); err != nil { // planning and calibration can take minutes
		return nil, err
	}
	metadata := func(inputs []InputFile) (map[string]string, error) {
		return outputMetadata(items, plan, calib, inputs, f, opt)
	}
	endWrite := timeline.Begin(timeline.Host, "quantize and write")
	if opt.gguf != nil {
		err = opt.gguf.write(dst, items, units, g, meta, hashes, report, metadata, opt.Log, opt.Sync)
	} else {
		err = staged.Dir(dst, opt.Overwrite, opt.Log, func(dir string) error {
			out, err := safetensors.NewCheckpointWriter(dir, shardTensors(tensors, len(ck.Files()), opt.MaxShardSize), meta)
			if err != nil {
				return err
			}
			defer out.Abort()
			out.SetSync(opt.Sync)
			if err := runUnits(out, units, g.workers()); err != nil {
				return err
			}
			defer timeline.Begin(timeline.Host, "commit the output")()
			if err := commitOutput(out, hashes, report, metadata); err != nil {
				return err
			}
			if err := writeModelConfigs(dir, cfg, f, items); err != nil {
				return err
			}
			return copyAuxFiles(ck.Dir, dir, opt.Log)
		})
	}
	endWrite()
	if err != nil {
		return nil, err
	}
	report.finish(time.Since(start))
	report.Breakdown = report.breakdown(g.stats(), runner.phases(start))
	fmt.Fprintf(opt.Log, "time: %s\n", formatPhases(report.Breakdown))
	return report, nil
}

// commitOutput waits for the input hashes and commits the output files with the final
// metadata, which only replaces the hash placeholders (same length, so nothing moves).
func commitOutput(out *safetensors.CheckpointWriter, hashes *inputHashes, report *Report, metadata func([]InputFile) (map[string]string, error)) error {
	inputs, err := hashes.wait()
	if err != nil {
		return err
	}
	report.HashSeconds, report.hashWaitSeconds, report.hashedBytes = hashes.seconds, hashes.waited, hashes.bytes()
	meta, err := metadata(inputs)
	if err != nil {
		return err
	}
	start := time.Now()
	if err := out.Commit(meta); err != nil {
		return err
	}
	report.CommitSeconds = time.Since(start).Seconds()
	report.Files = out.Names()
	return nil
}

// setupMethod opens the GPU as the device option asks and, for a method that calibrates, makes
// the runner that will feed the writer (on the GPU when there is one), whose calibration engines
// are made from the opening model's configuration meanwhile. Either may be nil.
func setupMethod(opt Options, items []Item, f packing.Format, opening *modelOpening) (*gpu, *blockRunner, error) {
	logf := func(format string, args ...any) { fmt.Fprintf(opt.Log, format, args...) }
	devices := opt.Devices
	if !opt.Method.Calibrates() || opt.Method.Scales() && awqOnOneGPU(items) { // RTN's kernels run on one GPU
		devices = firstDevice(opt.Devices)
	}
	g, err := openGPU(opt.Device, devices, opt.GPUSlots, logf)
	if err != nil {
		return nil, nil, err
	}
	if !opt.Method.Calibrates() {
		err := g.useKQuants(items)
		if err == nil {
			err = checkDevicePlan(g, opt.Device, items, f, opt)
		}
		if err != nil {
			g.close()
			return nil, nil, err
		}
		return g, nil, nil
	}
	runner, err := newBlockRunner(opt, items, logf)
	if err == nil && opt.Method.Scales() {
		err = useAWQ(runner, items, opt, g)
	} else if err == nil {
		err = runner.useGPU(g, opening)
	}
	if err != nil {
		g.close()
		return nil, nil, err
	}
	return g, runner, nil
}

// outTensor is one output tensor with the input shard it came from.
type outTensor struct {
	safetensors.WriterTensor
	shard int
}

// buildOutput turns the plan into the output tensors' descriptions and the units that write
// them: kept tensors are copied from the input, and each quantized weight becomes its
// format's packed tensors, all written by one unit.
func buildOutput(ck *safetensors.Checkpoint, items []Item, f packing.Format, opt Options, g *gpu, runner *blockRunner, report *Report) ([]outTensor, []unit, error) {
	report.Tensors = make([]TensorReport, len(items))
	layouts := layoutCache{}
	total := 0
	for _, it := range items {
		if it.Scheme != nil {
			total++
		}
	}
	var out []outTensor
	var units []unit
	var unitShard []int
	var unitBytes []int64
	var unitNames []string
	done := 0
	for i, it := range items {
		tr := &report.Tensors[i]
		*tr = TensorReport{Name: it.Info.Name, Shape: it.Info.Shape, InBytes: it.Info.Size, Scheme: "keep", OutBytes: it.Info.Size}
		if it.Scheme == nil {
			out = append(out, outTensor{safetensors.WriterTensor{Name: it.Info.Name, DType: it.Info.DType, Shape: it.Info.Shape}, it.ShardIdx})
			if runner.changes(it.Info.Name) {
				units = append(units, changedUnit(runner, it, &report.writes))
			} else {
				units = append(units, keptUnit(ck, it, &report.writes))
			}
			unitShard, unitBytes = append(unitShard, it.ShardIdx), append(unitBytes, it.Info.Size)
			unitNames = append(unitNames, it.Info.Name)
			continue
		}
		layout, err := layouts.get(f, it.Module, *it.Scheme, it.N(), it.K())
		if err != nil {
			return nil, nil, fmt.Errorf("tensor %s: %w", it.Info.Name, err)
		}
		done++
		tr.Scheme, tr.OutBytes = it.Scheme.String(), 0
		for _, r := range layout {
			tr.OutBytes += r.size
			tr.Outputs = append(tr.Outputs, r.Name)
			out = append(out, outTensor{safetensors.WriterTensor{Name: r.Name, DType: r.DType, Shape: r.Shape}, it.ShardIdx})
		}
		m := &packedModule{ck: ck, item: it, format: f, opt: opt, gpu: g, gptq: runner, layout: layout, report: tr,
			writes: &report.writes, progress: fmt.Sprintf("[%d/%d]", done, total)}
		units = append(units, m.write)
		unitShard, unitBytes = append(unitShard, it.ShardIdx), append(unitBytes, it.Info.Size)
		unitNames = append(unitNames, it.Info.Name)
	}
	units = tracked(units, unitBytes, opt)
	if runner == nil {
		units = interleaveShards(units, unitShard, unitBytes)
	} else {
		units = calibrationOrder(units, unitNames)
	}
	return out, units, nil
}

// keptUnit copies an input tensor unchanged, straight from the mapped file, once it has checked
// that a float tensor holds no NaN or ±Inf (a norm weight with one would poison every token).
func keptUnit(ck *safetensors.Checkpoint, it Item, writes *writeTimer) unit {
	name := it.Info.Name
	return func(out tensorSink) error {
		b, err := ck.Bytes(name)
		if err != nil {
			return err
		}
		if i := safetensors.FirstNonFinite(it.Info.DType, b); i >= 0 {
			ck.Release(name)
			return fmt.Errorf("tensor %s (%s): element %s is not finite", name, it.Info.File, elementAt(i, it.Info.Shape))
		}
		err = writes.write(out, name, b)
		ck.Release(name)
		return err
	}
}

// shardTensors groups the output like the input (one output shard per input shard), or by
// maxBytes when it is set.
func shardTensors(ts []outTensor, inputShards int, maxBytes int64) [][]safetensors.WriterTensor {
	flat := make([]safetensors.WriterTensor, len(ts))
	for i, t := range ts {
		flat[i] = t.WriterTensor
	}
	if maxBytes > 0 {
		return safetensors.SplitShards(flat, maxBytes)
	}
	shards := make([][]safetensors.WriterTensor, inputShards)
	for _, t := range ts {
		shards[t.shard] = append(shards[t.shard], t.WriterTensor)
	}
	var nonEmpty [][]safetensors.WriterTensor
	for _, s := range shards {
		if len(s) > 0 {
			nonEmpty = append(nonEmpty, s)
		}
	}
	return nonEmpty
}

func (r *Report) finish(elapsed time.Duration) {
	r.Seconds = elapsed.Seconds()
	r.WriteSeconds = r.writes.seconds()
	for _, t := range r.Tensors {
		r.QuantizeSeconds += t.Seconds
		r.InBytes += t.InBytes
		r.OutBytes += t.OutBytes
		params := numel(t.Shape)
		if t.Scheme != "keep" {
			r.Quantized++
			r.QuantParams += params
			r.QuantBytes += t.OutBytes
		}
	}
	for i := range r.Tensors {
		t := &r.Tensors[i]
		if p := numel(t.Shape); p > 0 {
			t.BPW = float64(8*t.OutBytes) / float64(p)
		}
	}
	if r.QuantParams > 0 {
		r.QuantBPW = float64(8*r.QuantBytes) / float64(r.QuantParams)
	}
	if r.OutBytes > 0 {
		r.Compression = float64(r.InBytes) / float64(r.OutBytes)
	}
}

// elementAt names element i of a tensor of this shape by its indices, e.g. "[3, 17]".
func elementAt(i int, shape []int) string {
	idx := make([]string, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = strconv.Itoa(i % shape[d])
			i /= shape[d]
		}
	}
	return "[" + strings.Join(idx, ", ") + "]"
}

func numel(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}
