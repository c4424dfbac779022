package blockwise

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/blockwise.cu

var (
	//go:embed kernels/blockwise.ptx
	blockwisePTX []byte
	//go:embed kernels/blockwise.sm_90.cubin
	blockwiseCubinSM90 []byte // the PTX assembled for the H100/H200: no JIT there
	//go:embed kernels/blockwise.cu
	blockwiseSource []byte
)

// Constants of kernels/blockwise.cu.
const (
	gpuTileRows = 32  // TILE_ROWS: rows of W per block
	gpuTileCols = 256 // TILE_COLS: columns of W per block
	gpuThreads  = 256 // THREADS
	gpuWarps    = 8   // WARPS
	pieceRows   = 16  // PIECE_ROWS: rows per warp of bw_piece_*
	pieceCols   = 128 // PIECE_COLS: columns per warp of bw_piece_*
	rowpcRows   = 8   // RPC_ROWS: rows per block of bw_rowpc_*
	// rowpcMaxCols is the longest row bw_rowpc_* holds in registers (its CPL 24), and
	// rowpcMaxStage the most shared memory its GPTQ stage may take (the default limit).
	rowpcMaxCols  = 6144
	rowpcMaxStage = 48 << 10
	// gpuBlocksPerSM is the minimum resident blocks per SM in the encode kernels'
	// __launch_bounds__.
	gpuBlocksPerSM = 3
)

// Enumerations shared with kernels/blockwise.cu.
const (
	layoutGPTQ  = 0
	layoutQPack = 1
	gridInt     = 0
	gridNF4     = 1
)

// kernelSuffixes name each kernel's variants by dtype code.
var kernelSuffixes = [3]string{"_bf16", "_f16", "_f32"}

// rowpcChunksPerLane are the row capacities of bw_rowpc_* (CPL: 8-column chunks per lane), in
// increasing order; the last one times 256 is rowpcMaxCols.
var rowpcChunksPerLane = []int{16, 24}

// pieceGroupSizes are the group sizes bw_piece_* and bw_bin_* handle.
var pieceGroupSizes = []int{32, 64, 128}

// pieceFamilies are the grids of bw_piece_* (by name) and bw_rowpc_* (the last three).
var pieceFamilies = []string{"int2", "int3", "int4", "int8", "nf4"}

var gpuDTypes = map[string]struct {
	code int32
	size int
}{"BF16": {0, 2}, "F16": {1, 2}, "F32": {2, 4}}

// GPUQuantizer quantizes weight tensors with round-to-nearest on the GPU and packs them in the
// GPTQ or qpack layout in the same pass. Its output is bit-identical to the CPU path,
// Quantize (with zero Options) followed by the packing Format's Pack.
//
// It is safe for concurrent use: it has several slots, each with its own stream, pinned host
// buffers and device buffers (grown to the largest tensor seen), and a call to QuantizePack
// takes a free slot for its duration, so that concurrent callers overlap one tensor's staging
// and upload with another's kernels and download.
type GPUQuantizer struct {
	dev     *cuda.Device
	module  *cuda.Module
	kernels struct {
		// encode kernels by dtype code: fused (parameters fitted in the kernel) or reading
		// the parameters of bw_params / bw_params_bin
		fusedInt, fusedNF4, encodeInt, encodeNF4, encodeBin [3]cuda.Function
		piece                                               map[string]cuda.Function // by name: see gpuJob.pieceKernel, rowpcKernel, binKernel
		params, paramsBin, packZeros                        cuda.Function
	}
	fp4        fp4Kernels      // kernels/microscaled.cu, loaded on the first FP4 tensor
	tileBlocks int             // blocks of the persistent encode kernels: gpuBlocksPerSM per SM
	nf4        cuda.DevicePtr  // the 15 NF4 thresholds
	all        []*cuda.Slot    // every slot, for Close
	free       chan *cuda.Slot // the slots not in use

	stats cuda.StatsRecorder

	poison bool // tests: fill every output and scratch buffer with garbage before each run
}

// DefaultGPUSlots is the number of concurrent QuantizePack calls a quantizer serves by
// default: one uploading, one computing, one downloading.
const DefaultGPUSlots = 3

// Device buffers of a slot.
const (
	bufInput = iota
	bufCodes
	bufScales
	bufZeros
	bufOffsets
	bufZeroBytes
	bufParamScale
	bufParamOffset
	bufStatus
	numBufs
)

// NewGPUQuantizer loads the kernels on dev, with DefaultGPUSlots slots.
func NewGPUQuantizer(dev *cuda.Device) (*GPUQuantizer, error) {
	return newGPUQuantizer(dev, DefaultGPUSlots, blockwisePTX, blockwiseCubinSM90)
}

// NewGPUQuantizerSlots loads the kernels on dev, with slots concurrent calls at most.
func NewGPUQuantizerSlots(dev *cuda.Device, slots int) (*GPUQuantizer, error) {
	return newGPUQuantizer(dev, slots, blockwisePTX, blockwiseCubinSM90)
}

// newGPUQuantizer loads ptx, or the one of cubins built for dev's architecture.
func newGPUQuantizer(dev *cuda.Device, slots int, ptx []byte, cubins ...[]byte) (*GPUQuantizer, error) {
	if slots < 1 {
		return nil, fmt.Errorf("blockwise: a GPU quantizer needs at least one slot, not %d", slots)
	}
	m, err := dev.LoadModuleFor(ptx, cubins...)
	if err != nil {
		return nil, fmt.Errorf("blockwise: loading kernels/blockwise.ptx: %w", err)
	}
	q := &GPUQuantizer{dev: dev, module: m, tileBlocks: gpuBlocksPerSM * dev.Info().Multiprocessors,
		free: make(chan *cuda.Slot, slots)}
	q.fp4.images = [][]byte{microscaledPTX, microscaledCubinSM90}
	k := &q.kernels
	kernels := []struct {
		dst  *cuda.Function
		name string
	}{
		{&k.params, "bw_params"}, {&k.paramsBin, "bw_params_bin"}, {&k.packZeros, "bw_pack_zeros"},
	}
	k.piece = map[string]cuda.Function{}
	for _, family := range append(slices.Clone(pieceFamilies), "bin") {
		var variants []string
		for _, gs := range pieceGroupSizes {
			if family == "bin" {
				variants = append(variants, fmt.Sprintf("bw_bin_g%d", gs))
			} else {
				variants = append(variants, fmt.Sprintf("bw_piece_%s_g%d", family, gs))
			}
		}
		if family == "int4" || family == "int8" || family == "nf4" {
			for _, cpl := range rowpcChunksPerLane {
				variants = append(variants, fmt.Sprintf("bw_rowpc_%s_c%d", family, cpl))
			}
		}
		for _, v := range variants {
			for _, suffix := range kernelSuffixes[:2] {
				f, err := m.Function(v + suffix)
				if err != nil {
					m.Unload()
					return nil, err
				}
				k.piece[v+suffix] = f
			}
		}
	}
	for code, suffix := range kernelSuffixes {
		for _, e := range []struct {
			dst  *[3]cuda.Function
			name string
		}{{&k.fusedInt, "bw_fused_int"}, {&k.fusedNF4, "bw_fused_nf4"}, {&k.encodeInt, "bw_encode_int"},
			{&k.encodeNF4, "bw_encode_nf4"}, {&k.encodeBin, "bw_encode_bin"}} {
			kernels = append(kernels, struct {
				dst  *cuda.Function
				name string
			}{&e.dst[code], e.name + suffix})
		}
	}
	for _, f := range kernels {
		if *f.dst, err = m.Function(f.name); err != nil {
			m.Unload()
			return nil, err
		}
	}
	thresholds := quant.NF4Thresholds()
	if q.nf4, err = dev.Alloc(4 * len(thresholds)); err == nil {
		err = dev.CopyToDevice(q.nf4, cuda.Bytes(thresholds[:]))
	}
	for range slots {
		if err != nil {
			break
		}
		err = q.addSlot()
	}
	if err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// addSlot creates a slot and makes it available.
func (q *GPUQuantizer) addSlot() error {
	sl, err := q.dev.NewSlot(numBufs)
	if err != nil {
		return err
	}
	q.all = append(q.all, sl)
	q.free <- sl
	return nil
}

// Slots is the number of QuantizePack calls that can run at once.
func (q *GPUQuantizer) Slots() int { return cap(q.free) }

// Close releases the quantizer's memory, streams and kernels. No QuantizePack call may be
// running.
func (q *GPUQuantizer) Close() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, sl := range q.all {
		keep(q.dev.ReleaseSlot(sl))
	}
	q.all = nil
	if q.nf4 != 0 {
		keep(q.dev.Free(q.nf4))
		q.nf4 = 0
	}
	keep(q.fp4.unload())
	keep(q.module.Unload())
	return first
}

// Supports reports whether the GPU path handles scheme s in format ("gptq", "gptq_v2",
// "qpack" or "compressed-tensors"): integer 2/3/4/8-bit grids in the first three, NF4 and
// binary in qpack, NVFP4 and MXFP4 in qpack and compressed-tensors; any group size. FP8, block
// FP8, 5- to 7-bit integers and the other formats stay on the CPU. Tensor shapes are checked
// by QuantizePack.
func (q *GPUQuantizer) Supports(s quant.Scheme, format string) bool {
	if s.Validate() != nil || (s.Grid == quant.Integer && s.Bits > 4 && s.Bits < 8) {
		return false
	}
	if s.IsFP4() {
		return fp4Format(format)
	}
	switch format {
	case "gptq", "gptq_v2":
		return s.Grid == quant.Integer
	case "qpack":
		return s.Grid == quant.Integer || s.Grid == quant.NF4 || s.Grid == quant.Binary
	}
	return false
}

// gpuJob is one tensor's quantization as the kernels see it.
type gpuJob struct {
	n, k      int
	dtype     int32
	s         quant.Scheme
	layout    int32
	zeroShift int32
	gsize     int // columns per group: K for per-channel or a group larger than K
	groups    int
	prefix    string
	format    string
	global    float32 // NVFP4: the given global scale, 0 to compute it from the tensor
}

func newGPUJob(dtype string, n, k int, s quant.Scheme, format, prefix string, global float32) (gpuJob, error) {
	dt, ok := gpuDTypes[dtype]
	if !ok {
		return gpuJob{}, fmt.Errorf("tensor %s: the GPU quantizer reads BF16, F16 or F32, not %q", prefix, dtype)
	}
	if err := checkArgs(n, k, s, Options{}); err != nil {
		return gpuJob{}, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	j := gpuJob{n: n, k: k, dtype: dt.code, s: s, layout: layoutQPack, prefix: prefix, format: format,
		gsize: s.GroupSize, groups: s.Groups(k), global: global}
	if j.gsize == quant.PerChannel || j.gsize > k {
		j.gsize = k
	}
	if s.IsFP4() {
		return j, checkFP4Job(j, format)
	}
	if global != 0 {
		return gpuJob{}, fmt.Errorf("tensor %s: global scale %g given for %s, which has none", prefix, global, s)
	}
	switch format {
	case "gptq", "gptq_v2":
		j.layout = layoutGPTQ
		if format == "gptq" {
			j.zeroShift = 1
		}
		if s.Grid != quant.Integer {
			return gpuJob{}, fmt.Errorf("tensor %s: format %s holds integer schemes, not %s", prefix, format, s)
		}
		if k*s.Bits%32 != 0 {
			return gpuJob{}, fmt.Errorf("tensor %s: format %s packs %d-bit codes along K in whole int32 words, so K·%d must be a multiple of 32 (K = %d)",
				prefix, format, s.Bits, s.Bits, k)
		}
	case "qpack":
		if s.Grid == quant.FP8E4M3 {
			return gpuJob{}, fmt.Errorf("tensor %s: the GPU quantizer does not do %s; use the CPU path", prefix, s)
		}
	default:
		return gpuJob{}, fmt.Errorf("tensor %s: the GPU quantizer packs gptq, gptq_v2 or qpack, not %q", prefix, format)
	}
	if int64((n+gpuTileRows-1)/gpuTileRows)*int64((k+gpuTileCols-1)/gpuTileCols) > math.MaxInt32 {
		return gpuJob{}, fmt.Errorf("tensor %s: %dx%d is too large for the GPU kernels' grid", prefix, n, k)
	}
	return j, nil
}

// fused reports whether the parameters are fitted inside the encode kernel: integer or NF4
// groups of 8·2^i ≤ 256 columns (a power-of-two number of lanes of one warp).
func (j gpuJob) fused() bool {
	lanes := j.gsize / 8
	return j.s.Grid != quant.Binary && j.gsize%8 == 0 && lanes <= 32 && bits.OnesCount(uint(lanes)) == 1
}

// pieceKernel names the one-launch kernel bw_piece_* that runs the job, or is "" when none does:
// it takes 16-bit inputs with K a multiple of 128, integer 2-, 3-, 4- or 8-bit or NF4 groups of
// 32, 64 or 128 columns, and at most 65535 bands of 16 rows.
func (j gpuJob) pieceKernel() string {
	if j.dtype == gpuDTypes["F32"].code || j.k%pieceCols != 0 || (j.n+pieceRows-1)/pieceRows > 65535 ||
		!slices.Contains(pieceGroupSizes, j.gsize) {
		return ""
	}
	switch {
	case j.s.Grid == quant.Integer && slices.Contains([]int{2, 3, 4, 8}, j.s.Bits):
		return fmt.Sprintf("bw_piece_int%d_g%d%s", j.s.Bits, j.gsize, kernelSuffixes[j.dtype])
	case j.s.Grid == quant.NF4:
		return fmt.Sprintf("bw_piece_nf4_g%d%s", j.gsize, kernelSuffixes[j.dtype])
	}
	return ""
}

// binKernel names the one-launch binary kernel bw_bin_* that runs the job, or is "" when none
// does: 16-bit inputs, groups of 32, 64 or 128 columns with K a multiple of two groups, and at
// most 65535 bands of 16 rows.
func (j gpuJob) binKernel() string {
	if j.s.Grid != quant.Binary || j.dtype == gpuDTypes["F32"].code || !slices.Contains(pieceGroupSizes, j.gsize) ||
		j.k%(2*j.gsize) != 0 || (j.n+pieceRows-1)/pieceRows > 65535 {
		return ""
	}
	return fmt.Sprintf("bw_bin_g%d%s", j.gsize, kernelSuffixes[j.dtype])
}

// pieceGrid is the launch grid of bw_piece_* and bw_bin_*: blocks of 8 warps along K (a warp
// takes 128 columns, or two binary groups), one band of 16 rows per block row.
func (j gpuJob) pieceGrid() cuda.Dim3 {
	cols := pieceCols
	if j.binKernel() != "" {
		cols = 2 * j.gsize
	}
	return cuda.Dim3{X: (j.k/cols + gpuWarps - 1) / gpuWarps, Y: (j.n + pieceRows - 1) / pieceRows, Z: 1}
}

// rowpcKernel names the one-launch per-channel kernel bw_rowpc_* that runs the job, or is ""
// when none does: it takes 16-bit inputs with one group per row of K ≤ 6144 columns, K a multiple
// of 8, integer 4- or 8-bit or NF4, and for GPTQ a stage of 8 rows' qweight words that fits
// rowpcMaxStage (8-bit K = 6144 fills it exactly).
func (j gpuJob) rowpcKernel() string {
	if j.pieceKernel() != "" || j.dtype == gpuDTypes["F32"].code || j.groups != 1 || j.k%8 != 0 ||
		j.k > rowpcMaxCols || (j.layout == layoutGPTQ && j.rowpcStageBytes() > rowpcMaxStage) {
		return ""
	}
	// the fewest registers that hold the row: a warp's lane takes 8·cpl columns
	cpl := rowpcChunksPerLane[slices.IndexFunc(rowpcChunksPerLane, func(c int) bool { return j.k <= 256*c })]
	switch {
	case j.s.Grid == quant.Integer && (j.s.Bits == 4 || j.s.Bits == 8):
		return fmt.Sprintf("bw_rowpc_int%d_c%d%s", j.s.Bits, cpl, kernelSuffixes[j.dtype])
	case j.s.Grid == quant.NF4:
		return fmt.Sprintf("bw_rowpc_nf4_c%d%s", cpl, kernelSuffixes[j.dtype])
	}
	return ""
}

// rowpcGrid is the launch grid of bw_rowpc_*: a block per 8 rows.
func (j gpuJob) rowpcGrid() cuda.Dim3 {
	return cuda.Dim3{X: (j.n + rowpcRows - 1) / rowpcRows, Y: 1, Z: 1}
}

// rowpcStageBytes is the dynamic shared memory of bw_rowpc_* in the GPTQ layout: 8 rows of
// K·b/32 words, each rounded up to a multiple of 32 (the kernel's bank swizzle stays in a row).
func (j gpuJob) rowpcStageBytes() int {
	words := j.k * j.s.Bits / 32
	return rowpcRows * ((words + 31) / 32 * 32) * 4
}

// outputSizes are the byte sizes of the packed tensors the kernels write.
func (j gpuJob) outputSizes() (codes, scales, zeros, offsets int) {
	b, n, k, ng := j.s.Bits, j.n, j.k, j.groups
	scales = 2 * n * ng
	if j.layout == layoutGPTQ {
		return k * b / 32 * n * 4, scales, ng * packing.PackedLen[uint32](n, b) * 4, 0
	}
	codes = n * packing.PackedLen[uint8](k, b)
	if j.s.Grid == quant.Integer && !j.s.Sym {
		zeros = n * packing.PackedLen[uint8](ng, b)
	}
	if j.s.Grid == quant.Binary && !j.s.Sym {
		offsets = 2 * n * ng
	}
	return codes, scales, zeros, offsets
}

// deviceBytes returns the size of every device buffer slot the job needs.
func (j gpuJob) deviceBytes() [numBufs]int {
	if j.s.IsFP4() {
		return j.fp4DeviceBytes()
	}
	var sz [numBufs]int
	sz[bufInput] = j.n * j.k * [3]int{2, 2, 4}[j.dtype]
	sz[bufCodes], sz[bufScales], sz[bufZeros], sz[bufOffsets] = j.outputSizes()
	ng := j.n * j.groups
	if j.s.Grid == quant.Integer && j.pieceKernel() == "" && j.rowpcKernel() == "" {
		sz[bufZeroBytes] = ng
	}
	if !j.fused() && j.binKernel() == "" {
		sz[bufParamScale] = 4 * ng
	}
	if j.s.Grid == quant.Binary && j.binKernel() == "" {
		sz[bufParamOffset] = 4 * ng
	}
	sz[bufStatus] = statusBytes
	return sz
}

// buffers grows slot sl's device buffers to the job's needs and returns them.
func (q *GPUQuantizer) buffers(sl *cuda.Slot, j gpuJob) ([numBufs]cuda.DevicePtr, error) {
	var ptrs [numBufs]cuda.DevicePtr
	for i, need := range j.deviceBytes() {
		b := &sl.Bufs[i]
		if err := q.dev.Grow(b, need); err != nil {
			return ptrs, fmt.Errorf("tensor %s: %w", j.prefix, err)
		}
		ptrs[i] = b.Ptr
		if q.poison && need > 0 {
			if err := q.dev.Fill32(b.Ptr, 0xa5a5a5a5, b.Size/4); err != nil {
				return ptrs, err
			}
		}
	}
	return ptrs, nil
}

// enqueue launches the kernels of job j on stream st: input in ptrs[bufInput], results in the
// other slots. The status words must already hold ~0 (run uploads them with the input).
func (q *GPUQuantizer) enqueue(j gpuJob, ptrs [numBufs]cuda.DevicePtr, st cuda.Stream) error {
	if j.s.IsFP4() {
		return q.enqueueFP4(j, ptrs, st)
	}
	k := &q.kernels
	s := j.s
	sym := int32(0)
	if s.Sym {
		sym = 1
	}
	n, kk, gsize, groups, nbits := int32(j.n), int32(j.k), int32(j.gsize), int32(j.groups), int32(s.Bits)
	spread := cuda.Dim3{X: min(max(1, (j.n*j.groups*32+gpuThreads-1)/gpuThreads), 65536), Y: 1, Z: 1}
	block := cuda.Dim3{X: gpuThreads, Y: 1, Z: 1}
	if name := j.pieceKernel(); name != "" {
		return k.piece[name].Launch(j.pieceGrid(), block, 0, st, ptrs[bufInput], n, kk, sym, j.zeroShift, j.layout,
			ptrs[bufCodes], ptrs[bufScales], ptrs[bufZeros], q.nf4, ptrs[bufStatus])
	}
	if name := j.binKernel(); name != "" {
		return k.piece[name].Launch(j.pieceGrid(), block, 0, st, ptrs[bufInput], n, kk, sym, ptrs[bufCodes], ptrs[bufScales],
			ptrs[bufOffsets], ptrs[bufStatus])
	}
	if name := j.rowpcKernel(); name != "" {
		shared := 0
		if j.layout == layoutGPTQ {
			shared = j.rowpcStageBytes()
		}
		return k.piece[name].Launch(j.rowpcGrid(), block, shared, st, ptrs[bufInput], n, kk, sym, j.zeroShift, j.layout,
			ptrs[bufCodes], ptrs[bufScales], ptrs[bufZeros], q.nf4, ptrs[bufStatus])
	}
	var encode cuda.Function
	switch {
	case j.fused() && s.Grid == quant.Integer:
		encode = k.fusedInt[j.dtype]
	case j.fused():
		encode = k.fusedNF4[j.dtype]
	case s.Grid == quant.Binary:
		encode = k.encodeBin[j.dtype]
		spread.X = min(max(1, (j.n*j.groups+gpuThreads-1)/gpuThreads), 65536)
		if err := k.paramsBin.Launch(spread, block, 0, st, ptrs[bufInput], j.dtype, n, kk, gsize, groups, sym,
			ptrs[bufScales], ptrs[bufOffsets], ptrs[bufParamScale], ptrs[bufParamOffset], ptrs[bufStatus]); err != nil {
			return err
		}
	default:
		grid, fn := int32(gridInt), k.encodeInt[j.dtype]
		if s.Grid == quant.NF4 {
			grid, fn = gridNF4, k.encodeNF4[j.dtype]
		}
		encode = fn
		if err := k.params.Launch(spread, block, 0, st, ptrs[bufInput], j.dtype, n, kk, gsize, groups, grid, nbits, sym,
			j.layout, ptrs[bufScales], ptrs[bufZeroBytes], ptrs[bufParamScale], ptrs[bufStatus]); err != nil {
			return err
		}
	}
	tiles := (j.k + gpuTileCols - 1) / gpuTileCols * ((j.n + gpuTileRows - 1) / gpuTileRows)
	if err := encode.Launch(cuda.Dim3{X: min(tiles, q.tileBlocks), Y: 1, Z: 1}, block, 0, st, ptrs[bufInput], j.dtype, n, kk, gsize, groups, nbits, sym, j.layout,
		ptrs[bufCodes], ptrs[bufScales], ptrs[bufZeroBytes], ptrs[bufParamScale], ptrs[bufParamOffset], q.nf4,
		ptrs[bufStatus]); err != nil {
		return err
	}
	if s.Grid != quant.Integer || (j.layout == layoutQPack && s.Sym) {
		return nil
	}
	_, _, zeroBytes, _ := j.outputSizes()
	words := (zeroBytes + 3) / 4
	if j.layout == layoutQPack {
		words = zeroBytes
	}
	return k.packZeros.Launch(cuda.Dim3{X: min(max(1, (words+gpuThreads-1)/gpuThreads), 65536), Y: 1, Z: 1}, block, 0, st,
		ptrs[bufZeroBytes], n, groups, nbits, sym, j.zeroShift, j.layout, ptrs[bufZeros])
}

// statusError turns the status words a finished run left into an error like the CPU
// reference's: the lowest row with a non-finite weight or a group whose scale overflows F16.
func (j gpuJob) statusError(status [2]uint64) error {
	groups := uint64(j.groups)
	weightRow, groupRow := status[0]/uint64(j.k), status[1]/groups
	switch {
	case status[0] != math.MaxUint64 && (status[1] == math.MaxUint64 || weightRow <= groupRow):
		return fmt.Errorf("tensor %s: weight at row %d, column %d is not finite", j.prefix, weightRow, status[0]%uint64(j.k))
	case status[1] != math.MaxUint64:
		return fmt.Errorf("tensor %s: row %d, group %d: scale or offset is not finite in F16 (weights too large)",
			j.prefix, groupRow, status[1]%groups)
	}
	return nil
}

// QuantizePack quantizes the tensor W[n, k] given as raw little-endian bytes of dtype ("BF16",
// "F16" or "F32") under s on the GPU and returns the tensors format's Pack would store for
// module prefix — the same names, dtypes, shapes and bytes as Quantize followed by Pack.
// It waits for a free slot; concurrent calls overlap on the GPU.
func (q *GPUQuantizer) QuantizePack(raw []byte, dtype string, n, k int, s quant.Scheme, format, prefix string) ([]packing.Raw, error) {
	j, err := newGPUJob(dtype, n, k, s, format, prefix, 0)
	if err != nil {
		return nil, err
	}
	if want := j.deviceBytes()[bufInput]; len(raw) != want {
		return nil, fmt.Errorf("tensor %s: %d bytes of %s for a %dx%d tensor (want %d)", prefix, len(raw), dtype, n, k, want)
	}
	var out []packing.Raw
	err = q.QuantizePackWith(func(dst []byte) error { copy(dst, raw); return nil }, dtype, n, k, s, format, prefix,
		func(raws []packing.Raw) error {
			for _, r := range raws {
				r.Data = append([]byte(nil), r.Data...) // out of the slot's pinned memory
				out = append(out, r)
			}
			return nil
		})
	return out, err
}

// QuantizePackWith is QuantizePack for callers that read the input straight into the slot's
// pinned staging memory and consume the results where they lie, saving a copy each way: fill
// writes the tensor's raw bytes into dst (exactly the tensor's size), and use receives the
// packed tensors as views of pinned memory, valid only until it returns. The slot stays taken
// until then.
func (q *GPUQuantizer) QuantizePackWith(fill func(dst []byte) error, dtype string, n, k int, s quant.Scheme, format, prefix string, use func([]packing.Raw) error) error {
	return q.QuantizePackScaled(fill, dtype, n, k, s, format, prefix, 0, use)
}

// QuantizePackScaled is QuantizePackWith with an NVFP4 tensor's global scale given (as
// Options.GlobalScale gives it to Quantize, e.g. one shared by q, k and v); 0 computes it from
// the tensor, and every other scheme takes 0.
func (q *GPUQuantizer) QuantizePackScaled(fill func(dst []byte) error, dtype string, n, k int, s quant.Scheme, format, prefix string,
	global float32, use func([]packing.Raw) error) error {
	j, err := newGPUJob(dtype, n, k, s, format, prefix, global)
	if err != nil {
		return err
	}
	if s.IsFP4() {
		if err := q.fp4.load(q.dev); err != nil {
			return err
		}
	}
	var t cuda.CallTimes
	waitStart := time.Now()
	sl := <-q.free
	defer func() { q.free <- sl }()
	t.Wait = time.Since(waitStart)
	out, err := q.run(sl, j, fill, &t)
	if err != nil {
		return err
	}
	st := out[bufStatus]
	if err := j.statusError([2]uint64{binary.LittleEndian.Uint64(st), binary.LittleEndian.Uint64(st[8:])}); err != nil {
		return err
	}
	useStart := time.Now()
	raws := j.raws(out[bufCodes], out[bufScales], out[bufZeros], out[bufOffsets])
	outBytes := 0
	for _, r := range raws {
		outBytes += len(r.Data)
	}
	err = use(raws)
	t.Use = time.Since(useStart)
	q.stats.Record(t, j.deviceBytes()[bufInput], outBytes)
	return err
}

// statusBytes is the size of the status words (see blockwise.cu): the lowest flat index of a
// non-finite weight and the lowest row·groups + group of a non-finite scale.
const statusBytes = 16

// downloaded are the device buffers a run copies back to the host.
var downloaded = []int{bufCodes, bufScales, bufZeros, bufOffsets, bufStatus}

// run stages raw in the slot's pinned memory, uploads it, runs the kernels and downloads the
// results, all on the slot's stream, timing each phase. It returns views of the slot's pinned
// output memory by buffer index, valid until the slot is used again.
func (q *GPUQuantizer) run(sl *cuda.Slot, j gpuJob, fill func([]byte) error, t *cuda.CallTimes) (map[int][]byte, error) {
	need := j.deviceBytes()
	in := need[bufInput]
	ptrs, err := q.buffers(sl, j)
	if err != nil {
		return nil, err
	}
	outBytes := 0
	for _, b := range downloaded {
		outBytes += need[b]
	}
	if err := q.dev.GrowHost(&sl.HostIn, in+statusBytes+4); err != nil {
		return nil, err
	}
	if err := q.dev.GrowHost(&sl.HostOut, outBytes); err != nil {
		return nil, err
	}
	stageStart := time.Now()
	if err := fill(sl.HostIn[:in]); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", j.prefix, err)
	}
	t.Staging = time.Since(stageStart)
	status := sl.HostIn[in : in+statusBytes]
	for i := range status {
		status[i] = 0xff // both words ~0: "nothing found", lowered by the kernels' atomicMin
	}
	fp4Word := sl.HostIn[in+statusBytes : in+statusBytes+4]
	copy(fp4Word, j.fp4InitWord())
	ev := sl.Events
	steps := []func() error{
		func() error { return q.dev.Record(ev[0], sl.Stream) },
		func() error { return q.dev.CopyToDeviceAsync(ptrs[bufStatus], status, sl.Stream) },
		func() error {
			if !j.s.IsFP4() {
				return nil
			}
			return q.dev.CopyToDeviceAsync(ptrs[bufParamScale], fp4Word, sl.Stream)
		},
		func() error { return q.dev.CopyToDeviceAsync(ptrs[bufInput], sl.HostIn[:in], sl.Stream) },
		func() error { return q.dev.Record(ev[1], sl.Stream) },
		func() error { return q.enqueue(j, ptrs, sl.Stream) },
		func() error { return q.dev.Record(ev[2], sl.Stream) },
	}
	out := map[int][]byte{}
	at := 0
	for _, b := range downloaded {
		out[b] = sl.HostOut[at : at+need[b]]
		at += need[b]
		steps = append(steps, func() error { return q.dev.CopyFromDeviceAsync(out[b], ptrs[b], sl.Stream) })
	}
	steps = append(steps, func() error { return q.dev.Record(ev[3], sl.Stream) })
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	if err := q.dev.SynchronizeStream(sl.Stream); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", j.prefix, err)
	}
	if err := q.dev.PhaseTimes(sl, t); err != nil {
		return nil, err
	}
	return out, nil
}

// raws names and shapes the downloaded tensors as Pack does, as views of pinned memory.
func (j gpuJob) raws(codes, scales, zeros, offsets []byte) []packing.Raw {
	if j.s.IsFP4() {
		return j.fp4Raws(j.format, codes, scales, offsets)
	}
	s, n, k, ng, p := j.s, j.n, j.k, j.groups, j.prefix
	if j.layout == layoutGPTQ {
		gidx := make([]byte, 4*k)
		for c := range k {
			binary.LittleEndian.PutUint32(gidx[4*c:], uint32(c/j.gsize))
		}
		return []packing.Raw{
			{Name: p + ".qweight", DType: "I32", Shape: []int{k * s.Bits / 32, n}, Data: codes},
			{Name: p + ".qzeros", DType: "I32", Shape: []int{ng, packing.PackedLen[uint32](n, s.Bits)}, Data: zeros},
			{Name: p + ".scales", DType: "F16", Shape: []int{ng, n}, Data: scales},
			{Name: p + ".g_idx", DType: "I32", Shape: []int{k}, Data: gidx},
		}
	}
	shape := make([]byte, 16)
	binary.LittleEndian.PutUint64(shape, uint64(n))
	binary.LittleEndian.PutUint64(shape[8:], uint64(k))
	out := []packing.Raw{
		{Name: p + ".qpack_shape", DType: "I64", Shape: []int{2}, Data: shape},
		{Name: p + ".qpack_codes", DType: "U8", Shape: []int{n, packing.PackedLen[uint8](k, s.Bits)}, Data: codes},
		{Name: p + ".qpack_scales", DType: "F16", Shape: []int{n, ng}, Data: scales},
	}
	if len(zeros) > 0 {
		out = append(out, packing.Raw{Name: p + ".qpack_zeros", DType: "U8", Shape: []int{n, packing.PackedLen[uint8](ng, s.Bits)}, Data: zeros})
	}
	if len(offsets) > 0 {
		out = append(out, packing.Raw{Name: p + ".qpack_offsets", DType: "F16", Shape: []int{n, ng}, Data: offsets})
	}
	return out
}

// GPUStats says where QuantizePack's time went, summed over every call since the quantizer
// was made (the use phase: the caller's use of the results in pinned memory; QuantizePack
// copies them out).
type GPUStats = cuda.SlotStats

// Stats returns the statistics of the calls finished so far.
func (q *GPUQuantizer) Stats() GPUStats { return q.stats.Stats() }
