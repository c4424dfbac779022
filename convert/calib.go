package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/dataset"
	"github.com/qpack-dev/qpack/internal/timeline"
	"github.com/qpack-dev/qpack/model"
)

// CalibOptions say which calibration data to run the model on.
type CalibOptions struct {
	File    string // text (tokenized with the checkpoint's tokenizer.json) or .npy token ids
	Samples int    // sequences (default 128)
	SeqLen  int    // tokens per sequence (default 512)
}

// Calibration is the calibration data as used, recorded in the output's provenance.
type Calibration struct {
	File    string `json:"file"`
	SHA256  string `json:"sha256"`
	Samples int    `json:"samples"`
	SeqLen  int    `json:"seq_len"`
	seqs    [][]int
}

// loadCalibration tokenizes the calibration file and cuts it into Samples consecutive,
// non-overlapping sequences of SeqLen tokens (deterministic, unlike the reference's random
// windows), refusing text that is too short.
func loadCalibration(src string, o CalibOptions) (*Calibration, error) {
	c := &Calibration{File: o.File, Samples: o.Samples, SeqLen: o.SeqLen}
	if c.Samples == 0 {
		c.Samples = 128
	}
	if c.SeqLen == 0 {
		c.SeqLen = 512
	}
	raw, err := os.ReadFile(o.File)
	if err != nil {
		return nil, fmt.Errorf("calibration data: %w", err)
	}
	sum := sha256.Sum256(raw)
	c.SHA256 = hex.EncodeToString(sum[:])
	ids, err := dataset.LoadIDs(o.File, src)
	if err != nil {
		return nil, fmt.Errorf("calibration data: %w", err)
	}
	if need := c.Samples * c.SeqLen; len(ids) < need {
		return nil, fmt.Errorf("calibration data %s has %d tokens; %d samples of %d tokens need %d (lower --calib-samples or --calib-seqlen, or give more text)",
			o.File, len(ids), c.Samples, c.SeqLen, need)
	}
	for i := range c.Samples {
		c.seqs = append(c.seqs, ids[i*c.SeqLen:(i+1)*c.SeqLen])
	}
	return c, nil
}

// channelEnergy accumulates, per linear module, the mean x² of each input channel over the
// calibration tokens: the diagonal of the Hessian XᵀX/n, which weighs weight errors by how much
// each input channel carries.
type channelEnergy struct {
	sums    map[string][]float64 // "block/group" → Σ x² per channel
	abs     map[string][]float64 // "block/group" → Σ |x| per channel (AWQ's statistic)
	tokens  map[string]int
	modules map[string]string // module prefix → its "block/group"
	blocks  int               // blocks in the model, for the progress lines
	logf    func(format string, args ...any)
	ctx     context.Context // stops the pass between blocks when done
	experts *expertRouting  // which experts' statistics come from every token
	total   int             // calibration tokens
}

func newChannelEnergy(ctx context.Context, blocks, total int, experts ExpertOptions, logf func(format string, args ...any)) *channelEnergy {
	return &channelEnergy{sums: map[string][]float64{}, abs: map[string][]float64{}, tokens: map[string]int{}, modules: map[string]string{},
		blocks: blocks, logf: logf, ctx: ctx, experts: newExpertRouting(experts, logf), total: total}
}

func energyKey(block int, g model.Group) string { return fmt.Sprintf("%d/%s", block, g) }

func (e *channelEnergy) Observe(block int, g model.Group, x []float32, rows, cols int) error {
	key := energyKey(block, g)
	s := e.sums[key]
	if s == nil {
		s = make([]float64, cols)
		e.sums[key] = s
		e.abs[key] = make([]float64, cols)
		e.experts.start(block, g)
	}
	e.experts.add(block, g, rows)
	if err := model.AddChannelStats(s, e.abs[key], x, rows, cols); err != nil {
		return fmt.Errorf("block %d, input of %s: %w", block, g, err)
	}
	e.tokens[key] += rows
	return nil
}

// Update records which modules read each observed input (an expert calibrated on every token
// reads GroupGateUp's); the weights stay as they are.
func (e *channelEnergy) Update(b *model.Block, groups []model.Group) error {
	e.experts.report("plan", b, e.total)
	for _, g := range groups {
		for _, l := range b.Linears(g) {
			e.modules[l.Name] = energyKey(b.Index, e.experts.source(b.Index, g))
		}
	}
	e.logf("plan: activation statistics of block %d/%d\n", b.Index+1, e.blocks)
	return e.ctx.Err()
}

// importance returns mean x² per input channel for every module, by module prefix.
func (e *channelEnergy) importance() map[string][]float32 { return e.means(e.sums) }

// meanAbs returns mean |x| per input channel for every module, by module prefix.
func (e *channelEnergy) meanAbs() map[string][]float32 { return e.means(e.abs) }

func (e *channelEnergy) means(sums map[string][]float64) map[string][]float32 {
	out := map[string][]float32{}
	for module, key := range e.modules {
		s, n := sums[key], e.tokens[key]
		imp := make([]float32, len(s))
		for i, v := range s {
			imp[i] = float32(v / float64(max(n, 1)))
		}
		out[module] = imp
	}
	return out
}

// gpuChannelEnergy gathers channelEnergy's sums on the GPUs (model.GPU.AddChannelStats), one
// partial sum per GPU over its share of the sequences, and brings each block's sums to the host
// when the block is done, the GPUs' added in order. Each GPU's buffers are kept from block to
// block (by group), zeroed on the stream at their first use in a block and read back on it:
// allocating, freeing and copying synchronously each block waited for all of a GPU's streams,
// the next block's upload included.
type gpuChannelEnergy struct {
	*channelEnergy
	engines []*model.GPU
	buffers []map[model.Group]deviceSums // each GPU's buffers, by group
	mu      sync.Mutex                   // buffers, the sums' maps and the expert counts while the GPUs observe at once
}

// deviceSums is one GPU's Σ x² then Σ |x| (cols float64 each) of a group, and the block whose
// sums it holds.
type deviceSums struct {
	p     cuda.DevicePtr
	cols  int
	block int
}

func (g *gpuChannelEnergy) ObserveGPU(block int, gr model.Group, x cuda.DevicePtr, rows, cols int) error {
	return g.ObserveShard(0, block, gr, x, rows, cols)
}

// ObserveShard adds x's channel sums to GPU shard's partial sums of the group.
func (g *gpuChannelEnergy) ObserveShard(shard, block int, gr model.Group, x cuda.DevicePtr, rows, cols int) error {
	p, err := g.partial(shard, block, gr, rows, cols)
	if err != nil {
		return err
	}
	return g.engines[shard].AddChannelStats(p, p.Add(8*cols), x, rows, cols)
}

// partial returns GPU shard's sums of group gr, zeroed on their first use in block, with rows
// counted.
func (g *gpuChannelEnergy) partial(shard, block int, gr model.Group, rows, cols int) (cuda.DevicePtr, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := energyKey(block, gr)
	if _, ok := g.sums[key]; !ok {
		g.sums[key], g.abs[key] = make([]float64, cols), make([]float64, cols)
		g.experts.start(block, gr)
	}
	g.experts.add(block, gr, rows)
	g.tokens[key] += rows
	e, d := g.engines[shard], g.buffers[shard][gr]
	if d.p != 0 && d.block == block {
		return d.p, nil
	}
	if d.p != 0 && d.cols != cols {
		e.Device().Free(d.p)
		d.p = 0
	}
	if d.p == 0 {
		p, err := e.Device().Alloc(16 * cols)
		if err != nil {
			return 0, err
		}
		d = deviceSums{p: p, cols: cols}
	}
	d.block = block
	g.buffers[shard][gr] = d
	return d.p, e.Device().Fill32Async(d.p, 0, 4*cols, e.Stream())
}

// Update adds up the block's sums (every GPU has finished the block's pass) and refuses
// non-finite ones: a NaN or Inf activation somewhere in that input.
func (g *gpuChannelEnergy) Update(b *model.Block, groups []model.Group) error {
	defer timeline.Begin(timeline.Host, "statistics of block %d", b.Index)()
	for _, gr := range groups {
		key := energyKey(b.Index, gr)
		cols := len(g.sums[key])
		if cols == 0 {
			continue
		}
		both := make([]float64, 2*cols)
		for i, e := range g.engines {
			d := g.buffers[i][gr]
			if d.p == 0 || d.block != b.Index {
				continue // no token of this GPU's reached the group (an expert)
			}
			if err := e.Download(cuda.Bytes(both), d.p); err != nil {
				return err
			}
			for c := range cols {
				g.sums[key][c] += both[c]
				g.abs[key][c] += both[cols+c]
			}
		}
		if i := firstNonFinite64(slices.Concat(g.sums[key], g.abs[key])); i >= 0 {
			return fmt.Errorf("block %d: non-finite activation in the input of %s (channel %d)", b.Index, gr, i%cols)
		}
	}
	return g.channelEnergy.Update(b, groups)
}

func (g *gpuChannelEnergy) free() {
	for i, bufs := range g.buffers {
		for _, d := range bufs {
			g.engines[i].Device().Free(d.p)
		}
	}
}

func firstNonFinite64(v []float64) int {
	for i, x := range v {
		if x != x || x-x != 0 {
			return i
		}
	}
	return -1
}

// measureImportance runs the model over the calibration sequences — on the GPU when device
// allows, each block once (observing only) — and returns each decoder linear's input-channel
// energy (mean x²) and mean |x|, logging a line per block.
// The GPU's GEMMs round as calibMath says (Options.CalibMath).
func measureImportance(ctx context.Context, src string, c *Calibration, device string, ordinals []int, calibMath string, experts ExpertOptions, logf func(format string, args ...any)) (energy, meanAbs map[string][]float32, err error) {
	engine, err := calibEngineOptions(calibMath)
	if err != nil {
		return nil, nil, err
	}
	m, err := model.Open(src)
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	devs, note, err := cuda.SelectMany(device, ordinals)
	if note != "" {
		logf("%s\n", note)
	}
	if err != nil {
		return nil, nil, err
	}
	defer closeDevices(devs)
	start, where := time.Now(), "the CPU"
	e := newChannelEnergy(ctx, m.Config.Layers, len(c.seqs)*c.SeqLen, experts, logf)
	// The statistics keep none of a block's slices: its memory goes to the next blocks' reads.
	opt := model.CalibrateOptions{ReleaseBlocks: true, RecycleBlocks: true, ObserveOnly: true, Experts: e.experts.observation()}
	if devs == nil {
		err = model.Calibrate(m, c.seqs, e, opt)
	} else {
		m.SetBlockReaders(gpuPassReaders)               // the GPUs would wait for one thread's reads
		m.SetRawLinears(func(int) bool { return true }) // the weights only go up: as stored, widened there
		where = gpuNames(devs[:min(len(devs), len(c.seqs))])
		err = e.calibrateOnGPU(devs, m, c.seqs, opt, engine)
	}
	if err != nil {
		return nil, nil, err
	}
	logf("plan: activation statistics over %d×%d calibration tokens on %s in %.1f s\n", len(c.seqs), c.SeqLen, where, time.Since(start).Seconds())
	return e.importance(), e.meanAbs(), nil
}

// GPU calibration math (Options.CalibMath).
const (
	CalibTF32     = "tf32"      // inputs rounded to TF32 (10-bit mantissa) on the tensor cores
	CalibBF16     = "bf16"      // linears and Gram matrices from BF16-rounded operands (8-bit significand): about twice TF32's rate
	CalibGramBF16 = "bf16-gram" // Gram matrices from BF16-rounded operands, linears in TF32
	CalibF16      = "fp16"      // linears and Gram matrices from FP16 operands scaled by powers of two: TF32's significand at BF16's rate
	CalibFP32     = "fp32"      // true float32: several times slower
)

// calibEngineOptions are the GPU engine's options for calibration math name ("" is the
// default, scaled FP16: the operands keep TF32's significand, at twice its rate).
func calibEngineOptions(name string) (model.GPUOptions, error) {
	r := calibrationRounds
	switch name {
	case "", CalibF16:
		return model.GPUOptions{TF32: r, F16: r}, nil
	case CalibTF32:
		return model.GPUOptions{TF32: r}, nil
	case CalibBF16:
		return model.GPUOptions{TF32: r, BF16: true}, nil
	case CalibGramBF16:
		return model.GPUOptions{TF32: r, GramBF16: true}, nil
	case CalibFP32:
		return model.GPUOptions{}, nil
	}
	return model.GPUOptions{}, fmt.Errorf("calibration math %q: want %s, %s, %s, %s or %s", name, CalibTF32, CalibF16, CalibBF16, CalibGramBF16, CalibFP32)
}

// gpuPassReaders is how many of a block's linears the plan's passes on GPUs read at once
// (model.Model.SetBlockReaders): an observing pass over a dense 7B block takes a fraction of its
// read by one thread.
const gpuPassReaders = 8

// calibrationRounds lets the GPU's calibration passes round GEMM operands (to TF32, or scaled
// to FP16: several times faster than float32). Tests that compare the GPU's choices with the
// CPU's on mixtures of experts turn it off, so that each token's top-k experts are the same on both.
var calibrationRounds = true

// calibrateOnGPU runs the observing passes on the GPUs with the GEMMs of engine, each GPU over
// its share of the sequences (model.CalibrateSharded) when there are several.
func (e *channelEnergy) calibrateOnGPU(devs []*cuda.Device, m *model.Model, seqs [][]int, opt model.CalibrateOptions, engine model.GPUOptions) error {
	engines, err := newEngines(devs[:min(len(devs), len(seqs))], m.Config, engine)
	defer closeEngines(engines)
	if err != nil {
		return err
	}
	g := &gpuChannelEnergy{channelEnergy: e, engines: engines}
	for range engines {
		g.buffers = append(g.buffers, map[model.Group]deviceSums{})
	}
	defer g.free()
	if len(engines) == 1 {
		return engines[0].Calibrate(m, seqs, g, opt)
	}
	return model.CalibrateSharded(engines, m, seqs, g, opt)
}
