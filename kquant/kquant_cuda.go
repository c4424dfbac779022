package kquant

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/kquant.cu

var (
	//go:embed kernels/kquant.ptx
	kquantPTX []byte
	//go:embed kernels/kquant.sm_90.cubin
	kquantCubinSM90 []byte // the PTX assembled for the H100/H200: no JIT there
	//go:embed kernels/kquant.cu
	kquantSource []byte
)

// GPUFitter fits whole k-quant tensors on a GPU: every super-block by Type.Fit's algorithm, one
// GPU thread per super-block (kernels/kquant.cu), giving the codes and parameters QuantizeRow
// gives on the CPU, bit for bit, and on request ggml's blocks of them (Type.AppendRow).
//
// It is safe for concurrent use: it has several slots, each with its own stream, pinned host
// buffers and device buffers (grown to the largest tensor seen), and a call takes a free slot
// for its duration, so that one tensor's reading and upload overlap another's fit and download.
type GPUFitter struct {
	dev    *cuda.Device
	mod    *cuda.Module
	fit    map[int]cuda.Function // kquant_fit_qX_k by code width
	pack   map[int]cuda.Function // kquant_pack_qX_k
	all    []*cuda.Slot          // every slot, for Close
	free   chan *cuda.Slot       // the slots not in use
	stats  cuda.StatsRecorder
	poison bool // tests: fill the outputs with garbage before each launch
}

// DefaultGPUSlots is the number of concurrent calls NewGPUFitter serves: one uploading, one
// fitting, one downloading.
const DefaultGPUSlots = 3

// Device buffers of a slot, in the fit kernel's argument order from bufCodes on.
const (
	bufRaw   = iota // the weights as stored (BF16, F16 or F32)
	bufF32          // the weights widened to float32 (unused for F32 input)
	bufImp          // the importance
	bufCodes        // the fit's outputs, as quant.Tensor holds them
	bufD
	bufDMin
	bufScales
	bufMins
	bufStatus // first non-finite weight, first non-finite super-block scale (uint64, ~0: none)
	bufBlocks // ggml's blocks
	numFitBufs
)

// NewGPUFitter loads the kernels on dev, with DefaultGPUSlots slots.
func NewGPUFitter(dev *cuda.Device) (*GPUFitter, error) {
	return newGPUFitter(dev, DefaultGPUSlots, kquantPTX, kquantCubinSM90)
}

// NewGPUFitterSlots loads the kernels on dev, with slots concurrent calls at most.
func NewGPUFitterSlots(dev *cuda.Device, slots int) (*GPUFitter, error) {
	return newGPUFitter(dev, slots, kquantPTX, kquantCubinSM90)
}

// newGPUFitter loads ptx, or the one of cubins built for dev's architecture.
func newGPUFitter(dev *cuda.Device, slots int, ptx []byte, cubins ...[]byte) (*GPUFitter, error) {
	if slots < 1 {
		return nil, fmt.Errorf("kquant: a GPU fitter needs at least one slot, not %d", slots)
	}
	m, err := dev.LoadModuleFor(ptx, cubins...)
	if err != nil {
		return nil, fmt.Errorf("kquant: loading kernels/kquant.ptx: %w", err)
	}
	g := &GPUFitter{dev: dev, mod: m, fit: map[int]cuda.Function{}, pack: map[int]cuda.Function{}, free: make(chan *cuda.Slot, slots)}
	for bits := range types {
		if g.fit[bits], err = m.Function(fmt.Sprintf("kquant_fit_q%d_k", bits)); err == nil {
			g.pack[bits], err = m.Function(fmt.Sprintf("kquant_pack_q%d_k", bits))
		}
		if err != nil {
			m.Unload()
			return nil, err
		}
	}
	for range slots {
		if err = g.addSlot(); err != nil {
			g.Close()
			return nil, err
		}
	}
	return g, nil
}

// addSlot creates a slot and makes it available.
func (g *GPUFitter) addSlot() error {
	sl, err := g.dev.NewSlot(numFitBufs)
	if err != nil {
		return err
	}
	g.all = append(g.all, sl)
	g.free <- sl
	return nil
}

// Slots is the number of calls that can run at once.
func (g *GPUFitter) Slots() int { return cap(g.free) }

// Stats says where the calls' time went.
func (g *GPUFitter) Stats() cuda.SlotStats { return g.stats.Stats() }

// Close releases the kernels, the streams and the memory. No call may be running.
func (g *GPUFitter) Close() error {
	var errs []error
	for _, sl := range g.all {
		errs = append(errs, g.dev.ReleaseSlot(sl))
	}
	g.all = nil
	errs = append(errs, g.mod.Unload())
	return errors.Join(errs...)
}

// Supports reports whether scheme s is fitted here: the k-quants.
func (g *GPUFitter) Supports(s quant.Scheme) bool {
	_, err := TypeOf(s)
	return err == nil
}

// Quantize fits every super-block of W[n, k] (float32, row-major) in k-quant scheme s, with
// per-input-channel importance imp (len k; nil for none: ggml's _ref fit), and returns the
// tensor that QuantizeRow of every row gives. Errors name the row and column like the CPU's.
func (g *GPUFitter) Quantize(w []float32, n, k int, s quant.Scheme, imp []float32) (*quant.Tensor, error) {
	if n <= 0 || k <= 0 || len(w) != n*k {
		return nil, fmt.Errorf("kquant: %d weights for a %dx%d tensor", len(w), n, k)
	}
	return g.QuantizeRaw(func(dst []byte) error { copy(dst, cuda.Bytes(w)); return nil }, cuda.F32, n, k, s, imp)
}

// QuantizeRaw is Quantize of W[n, k] given as raw little-endian bytes of dtype (BF16, F16 or
// F32, as a checkpoint stores them): fill writes them into dst (exactly n·k·dtype.Size() bytes of
// pinned memory), they go up as they are and are widened on the GPU.
func (g *GPUFitter) QuantizeRaw(fill func(dst []byte) error, dtype cuda.DType, n, k int, s quant.Scheme, imp []float32) (*quant.Tensor, error) {
	j, err := newFitJob(dtype, n, k, s, imp)
	if err != nil {
		return nil, err
	}
	q := quant.NewKQuantTensor(s, n, k)
	err = g.do(j, fill, func(out [][]byte) error {
		for i, b := range kernelOutputs(q) {
			copy(b, out[bufCodes+i])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return q, nil
}

// newFitJob checks the arguments of a fit of W[n, k] stored as dtype and makes its job.
func newFitJob(dtype cuda.DType, n, k int, s quant.Scheme, imp []float32) (fitJob, error) {
	kt, err := TypeOf(s)
	if err != nil {
		return fitJob{}, err
	}
	if n <= 0 || k <= 0 {
		return fitJob{}, fmt.Errorf("kquant: a %dx%d tensor", n, k)
	}
	if err := s.CheckRowLength(k); err != nil {
		return fitJob{}, fmt.Errorf("kquant: %w", err)
	}
	if dtype != cuda.F32 && dtype != cuda.F16 && dtype != cuda.BF16 {
		return fitJob{}, fmt.Errorf("kquant: the GPU fit reads BF16, F16 or F32 weights, not %s", dtype)
	}
	if imp != nil && len(imp) != k {
		return fitJob{}, fmt.Errorf("kquant: %d importance weights for %d input channels", len(imp), k)
	}
	return fitJob{kt: kt, n: n, k: k, dtype: dtype, imp: imp}, nil
}

// FitBlocks fits the k-quant tensor W[n, k] of scheme s (k a multiple of 256) given as raw
// little-endian bytes of dtype, with importance imp, as QuantizeRaw does, and hands use ggml's
// blocks of it (n rows of k/256 blocks, Type.AppendRow of QuantizeRaw's tensor, byte for byte):
// the blocks use receives are pinned memory, valid only until it returns. Only the weights as
// stored go up and only the blocks come down; the slot stays taken until use returns. Errors
// name the row and column as Quantize's do.
func (g *GPUFitter) FitBlocks(fill func(dst []byte) error, dtype cuda.DType, n, k int, s quant.Scheme, imp []float32, use func(blocks []byte) error) error {
	if k%quant.SuperBlock != 0 {
		return fmt.Errorf("kquant: a %dx%d tensor in ggml's %s blocks: K must be a multiple of 256", n, k, s)
	}
	j, err := newFitJob(dtype, n, k, s, imp)
	if err != nil {
		return err
	}
	j.blocks = true
	return g.do(j, fill, func(out [][]byte) error { return use(out[bufBlocks]) })
}

// fitJob is one call's tensor as the kernels see it.
type fitJob struct {
	kt     *Type
	n, k   int
	dtype  cuda.DType
	imp    []float32
	blocks bool // pack ggml's blocks and download only them; else the fit's outputs
}

// sizes returns the byte size of every device buffer the job needs (0: unused).
func (j fitJob) sizes() [numFitBufs]int {
	var sz [numFitBufs]int
	nk, blocks, subs := j.n*j.k, j.n*j.kt.Scheme.SuperBlocks(j.k), j.n*(j.k/j.kt.Sub)
	sz[bufRaw] = nk * j.dtype.Size()
	if j.dtype != cuda.F32 {
		sz[bufF32] = 4 * nk
	}
	sz[bufImp] = 4 * len(j.imp)
	sz[bufCodes], sz[bufD], sz[bufScales] = nk, 4*blocks, subs
	if j.kt.Mins {
		sz[bufDMin], sz[bufMins] = 4*blocks, subs
	}
	sz[bufStatus] = statusBytes
	if j.blocks {
		sz[bufBlocks] = blocks * j.kt.BlockBytes()
	}
	return sz
}

// downloads are the buffers the job copies back: the blocks or the fit's outputs, and the
// status words last.
func (j fitJob) downloads() []int {
	if j.blocks {
		return []int{bufBlocks, bufStatus}
	}
	return []int{bufCodes, bufD, bufDMin, bufScales, bufMins, bufStatus}
}

// statusBytes is the size of the two status words.
const statusBytes = 16

// do runs job j on a free slot: fill stages the weights, use receives the downloaded
// buffers by index (views of pinned memory) once the status words say the tensor is fine.
func (g *GPUFitter) do(j fitJob, fill func([]byte) error, use func(out [][]byte) error) error {
	var t cuda.CallTimes
	waitStart := time.Now()
	sl := <-g.free
	defer func() { g.free <- sl }()
	t.Wait = time.Since(waitStart)
	out, err := g.run(sl, j, fill, &t)
	if err != nil {
		return err
	}
	st := out[bufStatus]
	status := [2]uint64{binary.LittleEndian.Uint64(st), binary.LittleEndian.Uint64(st[8:])}
	weight := func(i int) float32 { return j.weight(sl.HostIn, i) }
	if err := j.refusal(status, weight, func(i int) (float32, float32, error) { return g.scales(sl, j, i) }); err != nil {
		return err
	}
	useStart := time.Now()
	err = use(out)
	t.Use = time.Since(useStart)
	outBytes := 0
	for _, b := range j.downloads() {
		outBytes += len(out[b])
	}
	g.stats.Record(t, j.sizes()[bufRaw], outBytes)
	return err
}

// refusal is the CPU's error for a tensor whose fit left the status words status, in the
// CPU's order: the first non-finite weight (weight reads it), bad importance, the first
// super-block whose d or dmin is not finite (scales reads them); nil when there is none.
func (j fitJob) refusal(status [2]uint64, weight func(i int) float32, scales func(i int) (d, dmin float32, err error)) error {
	if status[0] != math.MaxUint64 {
		i := int(status[0])
		return fmt.Errorf("weight at row %d, column %d is %g", i/j.k, i%j.k, weight(i))
	}
	for i, v := range j.imp {
		if badImportance(v) {
			return fmt.Errorf("importance of input channel %d is %g; want finite and ≥ 0", i, v)
		}
	}
	if status[1] == math.MaxUint64 {
		return nil
	}
	i := int(status[1])
	d, dmin, err := scales(i)
	if err != nil {
		return err
	}
	blocks := j.kt.Scheme.SuperBlocks(j.k)
	return fmt.Errorf("row %d, %w", i/blocks, j.kt.blockError(j.k, i%blocks, checkScale(d, dmin)))
}

// weight reads weight i of the staged raw input.
func (j fitJob) weight(raw []byte, i int) float32 {
	switch j.dtype {
	case cuda.BF16:
		return fp.BF16ToF32(binary.LittleEndian.Uint16(raw[2*i:]))
	case cuda.F16:
		return fp.F16ToF32(binary.LittleEndian.Uint16(raw[2*i:]))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
}

// scales reads d and dmin of super-block i (flat) from the slot's device buffers.
func (g *GPUFitter) scales(sl *cuda.Slot, j fitJob, i int) (d, dmin float32, err error) {
	var b [8]byte
	if err := g.dev.CopyFromDevice(b[:4], sl.Bufs[bufD].Ptr.Add(4*i)); err != nil {
		return 0, 0, err
	}
	if j.kt.Mins {
		if err := g.dev.CopyFromDevice(b[4:], sl.Bufs[bufDMin].Ptr.Add(4*i)); err != nil {
			return 0, 0, err
		}
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b[:])), math.Float32frombits(binary.LittleEndian.Uint32(b[4:])), nil
}

// run stages the job's input in the slot's pinned memory, uploads it, widens it to float32,
// fits (and packs) and downloads the results, all on the slot's stream, timing each phase. It
// returns views of the slot's pinned output memory by buffer index, valid until the slot is
// used again.
func (g *GPUFitter) run(sl *cuda.Slot, j fitJob, fill func([]byte) error, t *cuda.CallTimes) ([][]byte, error) {
	sz := j.sizes()
	for i, need := range sz {
		if err := g.dev.Grow(&sl.Bufs[i], need); err != nil {
			return nil, err
		}
	}
	raw, imp := sz[bufRaw], sz[bufImp]
	outBytes := 0
	for _, b := range j.downloads() {
		outBytes += sz[b]
	}
	if err := g.dev.GrowHost(&sl.HostIn, raw+imp+statusBytes); err != nil {
		return nil, err
	}
	if err := g.dev.GrowHost(&sl.HostOut, outBytes); err != nil {
		return nil, err
	}
	stageStart := time.Now()
	if err := fill(sl.HostIn[:raw]); err != nil {
		return nil, err
	}
	t.Staging = time.Since(stageStart)
	copy(sl.HostIn[raw:], cuda.Bytes(j.imp))
	status := sl.HostIn[raw+imp : raw+imp+statusBytes]
	for i := range status {
		status[i] = 0xff // both words ~0: nothing found yet, lowered by the kernel's atomicMin
	}
	if g.poison {
		for _, b := range []int{bufCodes, bufD, bufDMin, bufScales, bufMins, bufBlocks} {
			if sz[b] > 0 {
				if err := g.dev.Fill32(sl.Bufs[b].Ptr, 0x7fc0dead, sl.Bufs[b].Size/4); err != nil {
					return nil, err
				}
			}
		}
	}
	ptr := func(b int) cuda.DevicePtr {
		if sz[b] == 0 {
			return 0 // a null pointer: no importance, no mins
		}
		return sl.Bufs[b].Ptr
	}
	weights := ptr(bufRaw)
	out := make([][]byte, numFitBufs)
	ev, st := sl.Events, sl.Stream
	steps := []func() error{
		func() error { return g.dev.Record(ev[0], st) },
		func() error { return g.dev.CopyToDeviceAsync(ptr(bufRaw), sl.HostIn[:raw], st) },
		func() error {
			if imp == 0 {
				return nil
			}
			return g.dev.CopyToDeviceAsync(ptr(bufImp), sl.HostIn[raw:raw+imp], st)
		},
		func() error { return g.dev.CopyToDeviceAsync(ptr(bufStatus), status, st) },
		func() error { return g.dev.Record(ev[1], st) },
		func() error {
			if j.dtype == cuda.F32 {
				return nil
			}
			weights = ptr(bufF32)
			return g.dev.ConvertToF32(weights, ptr(bufRaw), j.dtype, j.n*j.k, st)
		},
		func() error {
			const threads = 128
			blocks := (j.n*j.kt.Scheme.SuperBlocks(j.k) + threads - 1) / threads
			return g.fit[j.kt.Bits].Launch(cuda.Dim3{X: blocks, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, st,
				weights, ptr(bufImp), int32(j.n), int32(j.k), ptr(bufCodes), ptr(bufD), ptr(bufDMin), ptr(bufScales), ptr(bufMins), ptr(bufStatus))
		},
		func() error {
			if !j.blocks {
				return nil
			}
			const threads = 128
			blocks := (j.n*(j.k/quant.SuperBlock) + threads - 1) / threads
			return g.pack[j.kt.Bits].Launch(cuda.Dim3{X: blocks, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, st,
				int32(j.n), int32(j.k), ptr(bufCodes), ptr(bufD), ptr(bufDMin), ptr(bufScales), ptr(bufMins), ptr(bufBlocks))
		},
		func() error { return g.dev.Record(ev[2], st) },
	}
	at := 0
	for _, b := range j.downloads() {
		out[b] = sl.HostOut[at : at+sz[b]]
		at += sz[b]
		steps = append(steps, func() error {
			if sz[b] == 0 {
				return nil
			}
			return g.dev.CopyFromDeviceAsync(out[b], ptr(b), st)
		})
	}
	steps = append(steps, func() error { return g.dev.Record(ev[3], st) })
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	if err := g.dev.SynchronizeStream(st); err != nil {
		return nil, err
	}
	if err := g.dev.PhaseTimes(sl, t); err != nil {
		return nil, err
	}
	return out, nil
}

// kernelOutputs are the slices of q the kernels write, in their argument order: codes, d, dmin,
// sub-block scales and mins (dmin and mins empty for q3_k and q6_k: null pointers).
func kernelOutputs(q *quant.Tensor) [][]byte {
	return [][]byte{q.Codes, cuda.Bytes(q.Scales), cuda.Bytes(q.Mins), cuda.Bytes(q.SubScales), q.SubMins}
}
