package model

import (
	_ "embed"
	"fmt"
	"math"
	"reflect"

	"github.com/qpack-dev/qpack/cuda"
	"golang.org/x/sync/errgroup"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/model.cu

var (
	//go:embed kernels/model.ptx
	modelPTX []byte
	//go:embed kernels/model.sm_90.cubin
	modelCubinSM90 []byte // the PTX assembled for the H100/H200: no JIT there
	//go:embed kernels/model.cu
	modelSource []byte
)

// rowThreads is ROW_THREADS of kernels/model.cu: the block size of the row-wise kernels.
const rowThreads = 256

// GPUOptions tune the GPU forward pass.
type GPUOptions struct {
	// TF32 lets cuBLAS round GEMM inputs to TF32 and use the tensor cores: several times
	// faster, with relative errors near 3e-4 instead of float32's 1e-6.
	TF32 bool
	// BF16 gives the linears' GEMMs (routers excepted) and the Gram matrices (AddGram)
	// bfloat16 operands — weights and activations rounded to nearest — at the tensor cores'
	// BF16 rate, about twice TF32's, accumulating in float32; relative errors near 3e-3. The
	// attention's products keep TF32 or float32 as TF32 says.
	BF16 bool
	// GramBF16 gives only the Gram matrices bfloat16 operands; the linears keep TF32 or float32.
	// A Gram matrix sums its rounding errors over every token with both signs alike, while the
	// forward pass carries each block's into the next.
	GramBF16 bool
	// F16 gives the linears' GEMMs (routers excepted) and the Gram matrices FP16 operands, each
	// weight tensor and each GEMM's activations scaled by a power of two that puts its largest
	// magnitude in FP16's top binade (to_f16_scaled; the GEMM's alpha undoes it exactly): TF32's
	// 11-bit significand over the whole range, at the BF16 rate. It takes precedence over BF16.
	F16 bool
}

// halfFormat is the 16-bit operand format of a kind of GEMM (GPUOptions).
type halfFormat int

const (
	noHalf   halfFormat = iota // float32 operands, rounded to TF32 where GPUOptions.TF32 says
	halfBF16                   // bfloat16, rounded to nearest even (to_bf16)
	halfF16                    // FP16 scaled by a power of two (to_f16_scaled)
)

// GPU runs the forward pass of models of one architecture on one GPU: cuBLAS GEMMs for the
// linears (and the attention products, unless flashAttention fuses them), kernels/model.cu for
// the rest. It works block by
// block over a batch of sequences whose hidden states stay on the GPU (a DeviceBatch), holding
// one block's weights at a time, which is what calibration needs and what lets a model larger
// than GPU memory be evaluated. Each operation mirrors the CPU forward pass (Block.Forward) and
// is tested against it. Not safe for concurrent use.
type GPU struct {
	dev         *cuda.Device
	cfg         *Config
	blas        *cuda.BLAS
	stream      cuda.Stream
	stager      *cuda.Stager // uploads weights through pinned memory
	rawArea     rawArea      // BF16 and F16 weights uploaded on the engine's stream, before widening
	ahead       aheadCopier  // uploads the next block's weights while this one calibrates (ahead_cuda.go)
	blocksAhead int          // blocks whose weights came ahead (tests)
	module      *cuda.Module
	fn          struct {
		embed, rmsNorm, addBias, add, siluMul, ropeHeads, mergeHeads, causalSoftmax, tokenNLL, tokenCompare    cuda.Function
		channelStatsPartial, channelStatsFinish, toBF16, mirrorUpper, sumUpperShards, scaleColumns, divideRows cuda.Function
		flash                                                                                                  cuda.Function // flash_attention_d<HeadDim>, when fused
	}
	scratch map[string]gpuBuffer // named work buffers, grown on demand
	spare   spares               // block buffers given back, for later blocks (spare_cuda.go)
	ropeT   int                  // positions covered by the uploaded rotary tables
	rope    *ropeTable

	peakUsed  uint64         // the most device memory seen in use (all processes), sampled per block
	chunkRows int            // tokens per pass of a block (see chunkSequences)
	band      int            // tests: query positions per band of attention (queryBand), 0 for the default
	fused     bool           // attention in one kernel (flashAttention): with F16, for head_dim 64 or 128
	current   *gpuBlock      // the block calibrateBlock is working on
	poison    bool           // tests: fill work buffers with NaN whenever they are handed out
	noStaging bool           // tests: calibrate dense blocks by recomputing passes (stagedState)
	sameInput sameInput      // the input of the linears run one after another on it (readSame)
	noSharing bool           // tests: convert the input for each linear (readSame)
	linears   halfFormat     // the linears' operands (GPUOptions)
	grams     halfFormat     // the Gram matrices' operands
	scalars   cuda.DevicePtr // with halfF16: the amax, shift and alpha of the last to_f16_scaled, and 0 and 1 (f16Scalar)
	reserve   uint64         // bytes the calibrator will need besides the engine's (Reserve)
	times     CalibrationTimes
}

type gpuBuffer struct {
	ptr  cuda.DevicePtr
	size int
}

// NewGPU prepares dev to run models of architecture cfg.
func NewGPU(dev *cuda.Device, cfg *Config, opt GPUOptions) (*GPU, error) {
	return newGPU(dev, cfg, opt, modelPTX, modelCubinSM90)
}

// newGPU is NewGPU with kernels ptx, or the one of cubins built for dev's architecture.
func newGPU(dev *cuda.Device, cfg *Config, opt GPUOptions, ptx []byte, cubins ...[]byte) (e *GPU, err error) {
	if cfg.HeadDim%2 != 0 || cfg.HeadDim > 1024 || cfg.Heads%cfg.KVHeads != 0 {
		return nil, fmt.Errorf("model: GPU forward needs an even head_dim ≤ 1024 and heads divisible by kv heads (have %d, %d, %d)",
			cfg.HeadDim, cfg.Heads, cfg.KVHeads)
	}
	e = &GPU{dev: dev, cfg: cfg, scratch: map[string]gpuBuffer{}, rope: newRopeTable(cfg), chunkRows: 8192}
	defer func() {
		if err != nil {
			e.Close()
			e = nil
		}
	}()
	if e.module, err = dev.LoadModuleFor(ptx, cubins...); err != nil {
		return nil, fmt.Errorf("model: loading kernels/model.ptx: %w", err)
	}
	for _, f := range []struct {
		dst  *cuda.Function
		name string
	}{
		{&e.fn.embed, "embed"}, {&e.fn.rmsNorm, "rms_norm"}, {&e.fn.addBias, "add_bias"}, {&e.fn.add, "add"},
		{&e.fn.siluMul, "silu_mul"}, {&e.fn.ropeHeads, "rope_heads"}, {&e.fn.mergeHeads, "merge_heads"},
		{&e.fn.causalSoftmax, "causal_softmax"}, {&e.fn.tokenNLL, "token_nll"}, {&e.fn.tokenCompare, "token_compare"},
		{&e.fn.channelStatsPartial, "channel_stats_partial"}, {&e.fn.channelStatsFinish, "channel_stats_finish"},
		{&e.fn.toBF16, "to_bf16"}, {&e.fn.mirrorUpper, "mirror_upper"}, {&e.fn.sumUpperShards, "sum_upper_shards"},
		{&e.fn.scaleColumns, "scale_columns"}, {&e.fn.divideRows, "divide_rows"},
	} {
		if *f.dst, err = e.module.Function(f.name); err != nil {
			return nil, err
		}
	}
	if e.stream, err = dev.NewStream(); err != nil {
		return nil, err
	}
	// The pinned buffer and the cuBLAS handle are made at once: each waits for the driver a
	// while (tens of milliseconds, more with several GPUs).
	var making errgroup.Group
	making.Go(func() (err error) {
		e.stager, err = dev.NewStager(cuda.DefaultStagingBytes)
		return err
	})
	making.Go(func() (err error) {
		if e.blas, err = dev.NewBLAS(); err != nil {
			return err
		}
		if err = e.blas.SetStream(e.stream); err != nil {
			return err
		}
		return e.blas.SetTF32(opt.TF32)
	})
	if err = making.Wait(); err != nil {
		return nil, err
	}
	switch {
	case opt.F16:
		e.linears, e.grams = halfF16, halfF16
	case opt.BF16:
		e.linears, e.grams = halfBF16, halfBF16
	case opt.GramBF16:
		e.grams = halfBF16
	}
	if e.linears == halfF16 {
		if e.scalars, err = dev.Alloc(4 * numF16Scalars); err != nil {
			return nil, err
		}
		if name := fmt.Sprintf("flash_attention_d%d", cfg.HeadDim); cfg.HeadDim == 64 || cfg.HeadDim == 128 {
			if e.fn.flash, err = e.module.Function(name); err != nil {
				return nil, err
			}
			e.fused = true
		}
		one := math.Float32bits(1)
		if err = e.upload(e.scalars, cuda.Bytes([]uint32{0, 0, 0, 0, one})); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// The float32 words at GPU.scalars (halfF16).
const (
	f16Amax  = iota // the largest magnitude to_f16_scaled's input, as float bits
	f16Shift        // the power of two of its activations
	f16Alpha        // the alpha of the GEMM that reads them
	f16Zero         // 0 and 1: the GEMMs' betas
	f16One
	f16QueryShift // flashAttention: the power of two of the queries, the alphas of its products
	f16AlphaQK
	f16AlphaV
	numF16Scalars
)

func (e *GPU) scalar(i int) cuda.DevicePtr { return e.scalars.Add(4 * i) }

// Close releases the GPU resources.
func (e *GPU) Close() error {
	e.closeSpares()
	for _, b := range e.scratch {
		e.dev.Free(b.ptr)
	}
	if e.scalars != 0 {
		e.dev.Free(e.scalars)
	}
	e.scratch = nil
	e.rawArea.free(e.dev)
	e.closeCopier()
	if e.stager != nil {
		e.stager.Close()
	}
	if e.blas != nil {
		e.blas.Close()
	}
	if e.stream != 0 {
		e.dev.DestroyStream(e.stream)
	}
	if e.module != nil {
		return e.module.Unload()
	}
	return nil
}

// accepts checks that m has the architecture the engine was made for.
func (e *GPU) accepts(m *Model) error {
	a, b := *e.cfg, *m.Config
	a.Architecture, b.Architecture = "", ""
	if !reflect.DeepEqual(a, b) {
		return fmt.Errorf("model: the GPU engine was prepared for %+v, not %+v", a, b)
	}
	return nil
}

// Reserve says how much GPU memory the calibrator will take besides the engine's (GPTQ's
// solvers grow to their largest problem during the first block): the engine keeps its staged
// calibration buffers only where they leave that much free, and 4 GiB more.
func (e *GPU) Reserve(bytes uint64) { e.reserve = bytes }

// Device is the GPU the engine runs on.
func (e *GPU) Device() *cuda.Device { return e.dev }

// Stream is the stream all of the engine's work is queued on; a GPUCalibrator queues its own
// work on it too, so that it runs in order with the forward pass.
func (e *GPU) Stream() cuda.Stream { return e.stream }

// PeakMemoryUsed is the most device memory seen in use (by every process, as cuMemGetInfo
// reports it), sampled after each block of each pass.
func (e *GPU) PeakMemoryUsed() uint64 { return e.peakUsed }

func (e *GPU) sampleMemory() error {
	free, total, err := e.dev.MemoryInfo()
	if err != nil {
		return err
	}
	e.peakUsed = max(e.peakUsed, total-free)
	return nil
}

// buffer returns the named work buffer with room for at least bytes.
func (e *GPU) buffer(name string, bytes int) (cuda.DevicePtr, error) {
	b := e.scratch[name]
	if b.size >= bytes {
		return b.ptr, nil
	}
	if b.ptr != 0 {
		if err := e.dev.SynchronizeStream(e.stream); err != nil {
			return 0, err
		}
		if err := e.dev.Free(b.ptr); err != nil {
			return 0, err
		}
		delete(e.scratch, name)
	}
	p, err := e.dev.Alloc(max(bytes, 256))
	if err != nil {
		return 0, fmt.Errorf("model: GPU work buffer %s: %w", name, err)
	}
	e.scratch[name] = gpuBuffer{p, max(bytes, 256)}
	return p, nil
}

// work returns the named buffer for intermediate results (poisoned in tests).
func (e *GPU) work(name string, bytes int) (cuda.DevicePtr, error) {
	p, err := e.buffer(name, bytes)
	if err == nil && e.poison {
		err = e.dev.Fill32(p, 0x7fc00000, bytes/4) // NaN: a value read before it is written shows
	}
	return p, err
}

// upload queues the copy of data to dst on the engine's stream, through its pinned buffer. A
// synchronous copy would run on the legacy default stream and wait for every stream of the GPU:
// in a calibration's first block, for the GPTQ solvers' warm-up.
func (e *GPU) upload(dst cuda.DevicePtr, data []byte) error {
	return e.stager.CopyToDevice(dst, data, e.stream)
}

// floats returns the named work buffer sized for n float32s.
func (e *GPU) floats(name string, n int) (cuda.DevicePtr, error) { return e.work(name, 4*n) }

// ropeTables returns the device cos and sin tables [T, HeadDim/2].
func (e *GPU) ropeTables(T int) (cos, sin cuda.DevicePtr, err error) {
	half := e.cfg.HeadDim / 2
	if cos, err = e.buffer("rope.cos", 4*T*half); err != nil {
		return 0, 0, err
	}
	if sin, err = e.buffer("rope.sin", 4*T*half); err != nil {
		return 0, 0, err
	}
	if e.ropeT < T {
		c, s := e.rope.get(T)
		if err := e.upload(cos, cuda.Bytes(c)); err != nil {
			return 0, 0, err
		}
		if err := e.upload(sin, cuda.Bytes(s)); err != nil {
			return 0, 0, err
		}
		e.ropeT = T
	}
	return cos, sin, nil
}

// elementwise launches an element-per-thread kernel over n elements.
func (e *GPU) elementwise(f cuda.Function, n int, args ...any) error {
	const threads = 256
	return f.Launch(cuda.Dim3{X: (n + threads - 1) / threads, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, e.stream, args...)
}

// rowwise launches a kernel with one block of rowThreads threads per row.
func (e *GPU) rowwise(f cuda.Function, rows int, args ...any) error {
	return f.Launch(cuda.Dim3{X: rows, Y: 1, Z: 1}, cuda.Dim3{X: rowThreads, Y: 1, Z: 1}, 0, e.stream, args...)
}

// rmsNorm is rmsNorm on the GPU: out[r] = weight·x[r]/rms(x[r]) for rows rows of dim values.
func (e *GPU) rmsNorm(out, x, weight cuda.DevicePtr, rows, dim int) error {
	return e.rowwise(e.fn.rmsNorm, rows, x, weight, out, int32(dim), float32(e.cfg.RMSNormEps))
}

// linear computes y[rows, Out] = x[rows, In]·Wᵀ + bias: with row-major operands the
// column-major cuBLAS product is yᵀ = W·xᵀ.
func (e *GPU) linear(y, x cuda.DevicePtr, l *gpuLinear, rows int) error {
	var err error
	if l.wb != 0 {
		err = e.halfLinear(y, x, l, rows)
	} else {
		err = e.blas.Sgemm(cuda.Trans, cuda.NoTrans, l.out, rows, l.in, 1, l.w, l.in, x, l.in, 0, y, l.out)
	}
	if err != nil {
		return fmt.Errorf("model: %s: %w", l.name, err)
	}
	if l.bias == 0 {
		return nil
	}
	return e.elementwise(e.fn.addBias, rows*l.out, y, l.bias, int64(rows*l.out), int32(l.out))
}

// halfLinear is linear's GEMM with 16-bit operands (GPUOptions.BF16 or F16).
func (e *GPU) halfLinear(y, x cuda.DevicePtr, l *gpuLinear, rows int) error {
	xb, err := e.linearInput(x, rows*l.in, l.shift)
	if err != nil {
		return err
	}
	if e.linears == halfF16 {
		return e.blas.GemmF16(cuda.Trans, cuda.NoTrans, l.out, rows, l.in, e.scalar(f16Alpha), l.wb, l.in, xb, l.in, e.scalar(f16Zero), y, l.out)
	}
	return e.blas.GemmBF16(cuda.Trans, cuda.NoTrans, l.out, rows, l.in, 1, l.wb, l.in, xb, l.in, 0, y, l.out)
}

// sameInput is an input that several linears read one after another (q, k and v; gate and up):
// converted to 16 bits for the first, then read as it is by the others.
type sameInput struct {
	x, half   cuda.DevicePtr
	n         int
	converted bool
}

// readSame calls run, whose linears all read x (n values) one after another, with x converted
// to 16 bits once: a conversion reads x twice (its largest magnitude, then the values) and writes
// half as much. With FP16 the power of two found for x is x's own, so each GEMM needs only its
// alpha for the weight's (cuda.Device.F16Alpha): the same bits as converting x for each. Nothing
// else may convert an input between those linears (the shift is read from the last conversion).
func (e *GPU) readSame(x cuda.DevicePtr, n int, run func() error) error {
	if !e.noSharing {
		e.sameInput = sameInput{x: x, n: n}
		defer func() { e.sameInput = sameInput{} }()
	}
	return run()
}

// linearInput returns x (n values) in the linears' 16-bit format, and with FP16 sets the GEMM's
// alpha for a weight scaled by 2^*shift: converted, or as converted for the linear before it
// (readSame).
func (e *GPU) linearInput(x cuda.DevicePtr, n int, shift cuda.DevicePtr) (cuda.DevicePtr, error) {
	same := &e.sameInput
	if same.x != x || same.n != n {
		return e.half(e.linears, "linear.x", x, n, shift)
	}
	if same.converted {
		if e.linears != halfF16 {
			return same.half, nil
		}
		return same.half, e.dev.F16Alpha(e.scalar(f16Shift), shift, e.scalar(f16Alpha), e.stream)
	}
	xb, err := e.half(e.linears, "linear.x", x, n, shift)
	same.half, same.converted = xb, err == nil
	return xb, err
}

// AddGram queues sum += xᵀx for x [rows, cols] (row-major) and sum [cols, cols] on the
// engine's stream: the Gram matrix of a linear's inputs, from which GPTQ's Hessian is made. As the
// matrix is symmetric, only the tiles on and above the diagonal are computed (gramTiles); call
// FinishGram once the sum is complete, before reading it.
func (e *GPU) AddGram(sum, x cuda.DevicePtr, rows, cols int) error {
	if rows == 0 { // an expert no token was routed to: nothing to add (nor to convert)
		return nil
	}
	src, size, gemm := x, 4, e.blas.Sgemm
	if e.grams != noHalf {
		xb, err := e.half(e.grams, "gram.x", x, rows*cols, 0)
		if err != nil {
			return err
		}
		src, size, gemm = xb, 2, e.blas.GemmBF16
		if e.grams == halfF16 {
			gemm = func(ta, tb cuda.Transpose, m, n, k int, _ float32, a cuda.DevicePtr, lda int, b cuda.DevicePtr, ldb int, _ float32, c cuda.DevicePtr, ldc int) error {
				return e.blas.GemmF16(ta, tb, m, n, k, e.scalar(f16Alpha), a, lda, b, ldb, e.scalar(f16One), c, ldc)
			}
		}
	}
	at := gramTileBounds(cols)
	for i := range len(at) - 1 {
		for j := i; j < len(at)-1; j++ { // the column-major tile (i, j): rows of tile i, columns of tile j
			m, n := at[i+1]-at[i], at[j+1]-at[j]
			if err := gemm(cuda.NoTrans, cuda.Trans, m, n, rows, 1, src.Add(size*at[i]), cols, src.Add(size*at[j]), cols,
				1, sum.Add(4*(at[i]+at[j]*cols)), cols); err != nil {
				return err
			}
		}
	}
	return nil
}

// gramTiles is how many tiles of rows and of columns AddGram cuts a Gram matrix into: of the 16
// GEMM tiles it computes the 10 on and above the diagonal, 37.5% fewer FLOPs, while each tile of
// a 7B's 4096 or 11008 columns (1024 or 2752 wide, × 8192 rows) still keeps the tensor cores busy.
const gramTiles = 4

// gramTileBounds returns the tiles' first columns and cols: multiples of 32 (aligned operands),
// one tile below 1024 columns.
func gramTileBounds(cols int) []int {
	tiles := gramTiles
	if cols < 1024 {
		tiles = 1
	}
	at := []int{0}
	for t := 1; t < tiles; t++ {
		at = append(at, cols*t/tiles/32*32)
	}
	return append(at, cols)
}

// FinishGram makes sum, accumulated by AddGram, the whole symmetric Gram matrix: its lower
// triangle is copied from the upper one.
func (e *GPU) FinishGram(sum cuda.DevicePtr, cols int) error {
	t := (cols + 31) / 32
	return e.fn.mirrorUpper.Launch(cuda.Dim3{X: t, Y: t, Z: 1}, cuda.Dim3{X: 32, Y: 8, Z: 1}, 0, e.stream, sum, int32(cols))
}

// half returns the named work buffer holding x's n values in format f, the activations of a GEMM
// whose other operand (with halfF16) was scaled by the power of two at other (0: x itself, a
// Gram matrix's); with halfF16 the GEMM's alpha is then at scalar(f16Alpha).
func (e *GPU) half(f halfFormat, name string, x cuda.DevicePtr, n int, other cuda.DevicePtr) (cuda.DevicePtr, error) {
	xb, err := e.work(name, 2*n)
	if err != nil {
		return 0, err
	}
	if f == halfF16 {
		return xb, e.toF16Scaled(xb, x, n, other, e.scalar(f16Shift), e.scalar(f16Alpha))
	}
	return xb, e.toBF16(xb, x, n)
}

// toF16Scaled queues dst[:n] = src[:n]·2^s in FP16 (cuda.Device.ToF16Scaled), writing s to
// shift and the alpha of the GEMM of dst with an operand scaled by 2^*other (other 0: by 2^s) to
// alpha; shift or alpha may be 0.
func (e *GPU) toF16Scaled(dst, src cuda.DevicePtr, n int, other, shift, alpha cuda.DevicePtr) error {
	return e.dev.ToF16Scaled(dst, src, n, e.scalar(f16Amax), other, shift, alpha, e.stream)
}

// toBF16 queues dst[:n] = src[:n] rounded to bfloat16 (kernels/model.cu to_bf16).
func (e *GPU) toBF16(dst, src cuda.DevicePtr, n int) error {
	return e.elementwise(e.fn.toBF16, n, src, dst, int64(n))
}

// Synchronize waits for the engine's queued work.
func (e *GPU) Synchronize() error { return e.dev.SynchronizeStream(e.stream) }

// Download copies src (device memory) into dst after the work queued on the engine's stream,
// through its pinned buffer: unlike a synchronous copy, it waits for no other stream of the GPU
// (the weights uploaded ahead, a solver's work). The engine must not be running elsewhere.
func (e *GPU) Download(dst []byte, src cuda.DevicePtr) error {
	return e.stager.CopyFromDevice(dst, src, e.stream)
}
