package awq

import (
	_ "embed"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/quant"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/awq.cu

var (
	//go:embed kernels/awq.ptx
	awqPTX []byte
	//go:embed kernels/awq.sm_90.cubin
	awqCubinSM90 []byte // the PTX assembled for the H100/H200: no JIT there
	//go:embed kernels/awq.cu
	awqSource []byte
)

// sumBlocks is the grid of sum_squares_partial: the number of partial sums the host adds.
const sumBlocks = 1024

// GPUSearch runs SearchScale and SearchClip on a GPU (kernels/awq.cu): every candidate weight
// is fake-quantized there with the CPU's arithmetic, bit for bit, and its output error is one
// cuBLAS GEMM of the weight difference with the sampled inputs — ‖X·(Q(W·s)/s − W)ᵀ‖², the
// same quantity as the reference's ‖X·(Q(W·s)/s)ᵀ − X·Wᵀ‖² without the cancellation. The α
// search's GEMMs round their operands (Math: 20 candidates over thousands of tokens, and the
// error measured is quantization's, three orders above the rounding), the clipping search's
// are true float32. The inputs live on the device (DeviceInputs). Not safe for concurrent use.
type GPUSearch struct {
	dev     *cuda.Device
	blas    *cuda.BLAS
	stream  cuda.Stream
	stager  *cuda.Stager
	mod     *cuda.Module
	scratch map[string]scratchBuffer
	fn      struct{ fakeQuantDiff, sumSquares, groupErrors, gatherRows, divideColumns cuda.Function }
	scalars cuda.DevicePtr // the words of scaled FP16 (f16Amax …)
	// Math is the α search's GEMM arithmetic (SearchF16 from NewGPUSearch); tests choose
	// SearchF32 to compare losses with the CPU's closely.
	Math SearchMath
}

// SearchMath is the arithmetic of the α search's GEMMs.
type SearchMath int

const (
	// SearchF16 scales the sampled inputs (once per search) and each candidate's weight
	// differences by powers of two into FP16 (cuda.Device.ToF16Scaled): TF32's 11-bit
	// significands at the tensor cores' FP16 rate, twice TF32's.
	SearchF16  SearchMath = iota
	SearchTF32            // operands rounded to TF32 by cuBLAS
	SearchF32             // true float32
)

// The float32 words at GPUSearch.scalars.
const (
	f16Amax   = iota // ToF16Scaled's scratch
	f16ShiftX        // the power of two of the sampled inputs in FP16
	f16Alpha         // the GEMM's alpha, undoing both operands' scales
	f16Zero          // its beta
	numF16Scalars
)

type scratchBuffer struct {
	ptr  cuda.DevicePtr
	size int
}

// NewGPUSearch loads the kernels and cuBLAS on dev.
func NewGPUSearch(dev *cuda.Device) (*GPUSearch, error) {
	return newGPUSearch(dev, awqPTX, awqCubinSM90)
}

// newGPUSearch is NewGPUSearch with kernels ptx, or the one of cubins built for dev's architecture.
func newGPUSearch(dev *cuda.Device, ptx []byte, cubins ...[]byte) (g *GPUSearch, err error) {
	g = &GPUSearch{dev: dev, scratch: map[string]scratchBuffer{}}
	defer func() {
		if err != nil {
			g.Close()
			g = nil
		}
	}()
	if g.mod, err = dev.LoadModuleFor(ptx, cubins...); err != nil {
		return nil, fmt.Errorf("awq: loading kernels/awq.ptx: %w", err)
	}
	for _, f := range []struct {
		dst  *cuda.Function
		name string
	}{{&g.fn.fakeQuantDiff, "fake_quant_diff"}, {&g.fn.sumSquares, "sum_squares_partial"}, {&g.fn.groupErrors, "group_errors"},
		{&g.fn.gatherRows, "gather_rows"}, {&g.fn.divideColumns, "divide_columns"}} {
		if *f.dst, err = g.mod.Function(f.name); err != nil {
			return nil, err
		}
	}
	if g.stream, err = dev.NewStream(); err != nil {
		return nil, err
	}
	if g.stager, err = dev.NewStager(cuda.DefaultStagingBytes); err != nil {
		return nil, err
	}
	if g.blas, err = dev.NewBLAS(); err != nil {
		return nil, err
	}
	if g.scalars, err = g.buffer("f16.scalars", 4*numF16Scalars); err != nil {
		return nil, err
	}
	if err = dev.Fill32Async(g.scalars, 0, numF16Scalars, g.stream); err != nil {
		return nil, err
	}
	return g, g.blas.SetStream(g.stream)
}

func (g *GPUSearch) scalar(i int) cuda.DevicePtr { return g.scalars.Add(4 * i) }

// Close releases the GPU resources.
func (g *GPUSearch) Close() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	if g.stream != 0 {
		keep(g.dev.SynchronizeStream(g.stream))
	}
	for _, b := range g.scratch {
		keep(g.dev.Free(b.ptr))
	}
	if g.blas != nil {
		keep(g.blas.Close())
	}
	if g.stager != nil {
		keep(g.stager.Close())
	}
	if g.stream != 0 {
		keep(g.dev.DestroyStream(g.stream))
	}
	if g.mod != nil {
		keep(g.mod.Unload())
	}
	return first
}

// buffer returns the named scratch buffer with room for at least bytes.
func (g *GPUSearch) buffer(name string, bytes int) (cuda.DevicePtr, error) {
	b := g.scratch[name]
	if b.size >= bytes {
		return b.ptr, nil
	}
	if b.ptr != 0 {
		if err := g.dev.SynchronizeStream(g.stream); err != nil {
			return 0, err
		}
		if err := g.dev.Free(b.ptr); err != nil {
			return 0, err
		}
		delete(g.scratch, name)
	}
	p, err := g.dev.Alloc(max(bytes, 256))
	if err != nil {
		return 0, fmt.Errorf("awq: GPU buffer %s (%d bytes): %w", name, bytes, err)
	}
	g.scratch[name] = scratchBuffer{p, max(bytes, 256)}
	return p, nil
}

// upload copies v into the named scratch buffer, queued on the search's stream.
func (g *GPUSearch) upload(name string, v []float32) (cuda.DevicePtr, error) {
	p, err := g.buffer(name, 4*len(v))
	if err != nil {
		return 0, err
	}
	return p, g.stager.CopyToDevice(p, cuda.Bytes(v), g.stream)
}

// download waits for the stream and copies n values of type T from p.
func download[T float32 | float64](g *GPUSearch, p cuda.DevicePtr, n int) ([]T, error) {
	if err := g.dev.SynchronizeStream(g.stream); err != nil {
		return nil, err
	}
	out := make([]T, n)
	if err := g.dev.CopyFromDevice(cuda.Bytes(out), p); err != nil {
		return nil, err
	}
	return out, nil
}

func launch1D(f cuda.Function, n int, st cuda.Stream, args ...any) error {
	const threads = 256
	return f.Launch(cuda.Dim3{X: (n + threads - 1) / threads, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, st, args...)
}

// fakeQuantDiff queues kernels/awq.cu's fake_quant_diff for the rows of w (device, [rows, k])
// into d: with s (device, len k) the α candidate Q(W·s)/s − W, else the clipping candidate
// W − Q(clamp(W, ±absmax·shrink)) with each group's absmax written to absmax (if non-zero).
func (g *GPUSearch) fakeQuantDiff(w, s, d, absmax cuda.DevicePtr, rows, k int, sc quant.Scheme, shrink float32) error {
	gs := groupSize(sc, k)
	groups := (k + gs - 1) / gs
	const threads = 128 // GROUP_THREADS
	return g.fn.fakeQuantDiff.Launch(cuda.Dim3{X: rows * groups, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, g.stream,
		w, s, d, absmax, int32(k), int32(gs), int32(groups), int32(sc.MaxQ()), boolArg(sc.Sym), shrink)
}

// groupSize is the number of input channels per group of scheme s on rows of k.
func groupSize(s quant.Scheme, k int) int {
	if s.GroupSize <= 0 || s.GroupSize > k {
		return k
	}
	return s.GroupSize
}

func boolArg(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// sumSquares queues the partial sums of x[i]² (n floats) into the named buffer's slot
// (sumBlocks doubles at offset slot·sumBlocks).
func (g *GPUSearch) sumSquares(x cuda.DevicePtr, n int, partials cuda.DevicePtr, slot int) error {
	const threads = 256 // SUM_THREADS
	return g.fn.sumSquares.Launch(cuda.Dim3{X: sumBlocks, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, g.stream,
		x, int64(n), partials.Add(8*slot*sumBlocks))
}

// SearchScale is SearchScale with the sampled inputs x [rows, K] on the device (read on the
// search's stream: work that wrote them on another stream must be finished). ScaleResult.Losses
// gives every candidate's loss.
func (g *GPUSearch) SearchScale(x cuda.DevicePtr, rows int, xMean []float32, ls []Linear, opt Options) (ScaleResult, error) {
	k := len(xMean)
	if rows <= 0 {
		return ScaleResult{}, fmt.Errorf("awq: no input rows for %s", ls[0].Name)
	}
	planned, out, err := plannedRows(ls, k)
	if err != nil {
		return ScaleResult{}, err
	}
	if err := g.blas.SetTF32(g.Math == SearchTF32); err != nil {
		return ScaleResult{}, err
	}
	src, err := g.weightsOnGPU(planned, k)
	if err != nil {
		return ScaleResult{}, err
	}
	var wMean []float32
	if opt.Duo {
		wMean = weightMean(ls, k)
	}
	steps := opt.grid()
	cands := make([][]float32, steps)
	var wg sync.WaitGroup // a power per channel and candidate: 20·k of them, while the GPU waits
	for step := range steps {
		wg.Go(func() { cands[step] = DuoCandidate(xMean, wMean, float64(step)/float64(steps)) })
	}
	wg.Wait()
	all := slices.Concat(cands...)
	sd, err := g.upload("scale.s", all)
	if err != nil {
		return ScaleResult{}, err
	}
	d, err := g.buffer("scale.d", 4*out*k)
	if err != nil {
		return ScaleResult{}, err
	}
	e, err := g.buffer("scale.e", 4*out*rows)
	if err != nil {
		return ScaleResult{}, err
	}
	partials, err := g.buffer("scale.partials", 8*steps*sumBlocks)
	if err != nil {
		return ScaleResult{}, err
	}
	outputErrors, err := g.outputErrors(x, rows, k, out)
	if err != nil {
		return ScaleResult{}, err
	}
	for step := range steps {
		s := sd.Add(4 * step * k)
		for i, l := range planned {
			off := 4 * rowOffset(planned, i) * k
			if err := g.fakeQuantDiff(src[i], s, d.Add(off), 0, l.Out, k, *l.Scheme, 1); err != nil {
				return ScaleResult{}, err
			}
		}
		if err := outputErrors(e, d); err != nil {
			return ScaleResult{}, err
		}
		if err := g.sumSquares(e, out*rows, partials, step); err != nil {
			return ScaleResult{}, err
		}
	}
	sums, err := download[float64](g, partials, steps*sumBlocks)
	if err != nil {
		return ScaleResult{}, err
	}
	best := ScaleResult{Loss: math.Inf(1), Losses: make([]float64, steps)}
	for step := range steps {
		var sum float64
		for _, v := range sums[step*sumBlocks : (step+1)*sumBlocks] {
			sum += v
		}
		loss := sum / float64(rows*out)
		best.Losses[step] = loss
		if step == 0 {
			best.Loss0 = loss
		}
		if loss < best.Loss {
			best.Loss, best.Alpha, best.Scales = loss, float64(step)/float64(steps), cands[step]
		}
	}
	if best.Scales == nil {
		return best, fmt.Errorf("awq: no α gave a finite loss (%s)", ls[0].Name)
	}
	return best, nil
}

// outputErrors returns the function that sets e [out, rows] (column-major) = D [out, k] · Xᵀ,
// the row-major [rows, out] output errors of the weight differences D, in the search's Math;
// with SearchF16 it converts x to FP16 first, once for every candidate.
func (g *GPUSearch) outputErrors(x cuda.DevicePtr, rows, k, out int) (func(e, d cuda.DevicePtr) error, error) {
	if g.Math != SearchF16 {
		return func(e, d cuda.DevicePtr) error {
			return g.blas.Sgemm(cuda.Trans, cuda.NoTrans, out, rows, k, 1, d, k, x, k, 0, e, out)
		}, nil
	}
	x16, err := g.buffer("scale.x16", 2*rows*k)
	if err != nil {
		return nil, err
	}
	d16, err := g.buffer("scale.d16", 2*out*k)
	if err != nil {
		return nil, err
	}
	amax, shiftX, alpha := g.scalar(f16Amax), g.scalar(f16ShiftX), g.scalar(f16Alpha)
	if err := g.dev.ToF16Scaled(x16, x, rows*k, amax, 0, shiftX, 0, g.stream); err != nil {
		return nil, err
	}
	return func(e, d cuda.DevicePtr) error {
		if err := g.dev.ToF16Scaled(d16, d, out*k, amax, shiftX, 0, alpha, g.stream); err != nil {
			return err
		}
		return g.blas.GemmF16(cuda.Trans, cuda.NoTrans, out, rows, k, alpha, d16, k, x16, k, g.scalar(f16Zero), e, out)
	}, nil
}

// weightsOnGPU returns where each linear's W is on the GPU: its OnGPU copy, or else uploaded
// into the search's buffer at the linear's rows.
func (g *GPUSearch) weightsOnGPU(ls []Linear, k int) ([]cuda.DevicePtr, error) {
	src := make([]cuda.DevicePtr, len(ls))
	rows := 0
	for _, l := range ls {
		if l.OnGPU == 0 {
			rows += l.Out
		}
	}
	if rows == 0 {
		for i, l := range ls {
			src[i] = l.OnGPU
		}
		return src, nil
	}
	buf, err := g.buffer("scale.w", 4*rows*k)
	if err != nil {
		return nil, err
	}
	off := 0
	for i, l := range ls {
		if src[i] = l.OnGPU; src[i] != 0 {
			continue
		}
		src[i] = buf.Add(4 * off * k)
		if err := g.stager.CopyToDevice(src[i], cuda.Bytes(l.W), g.stream); err != nil {
			return nil, err
		}
		off += l.Out
	}
	return src, nil
}

// plannedRows checks the group's shapes and returns the linears that are quantized and their
// total output rows.
func plannedRows(ls []Linear, k int) ([]Linear, int, error) {
	var planned []Linear
	out := 0
	for _, l := range ls {
		if l.In != k || len(l.W) != l.Out*l.In {
			return nil, 0, fmt.Errorf("awq: %s is %dx%d with %d weights; the group input has %d channels", l.Name, l.Out, l.In, len(l.W), k)
		}
		if l.Scheme != nil {
			planned = append(planned, l)
			out += l.Out
		}
	}
	return planned, out, nil
}

// rowOffset is the first row of planned[i] in their concatenation.
func rowOffset(planned []Linear, i int) int {
	off := 0
	for _, l := range planned[:i] {
		off += l.Out
	}
	return off
}

// SearchClip is SearchClip with the scaled inputs x [rows, In] on the device; it clamps l.W in
// place on the host, as the reference does.
func (g *GPUSearch) SearchClip(x cuda.DevicePtr, rows int, l Linear, opt Options) (ClipResult, error) {
	n, k := l.Out, l.In
	if l.Scheme == nil {
		return ClipResult{}, fmt.Errorf("awq: %s: clipping search of a linear that is not quantized", l.Name)
	}
	gs := groupSize(*l.Scheme, k)
	groups := (k + gs - 1) / gs
	stride, t := sampling(rows, opt.clipTokens())
	if err := g.blas.SetTF32(false); err != nil {
		return ClipResult{}, err
	}
	wd, err := g.upload("clip.w", l.W)
	if err != nil {
		return ClipResult{}, err
	}
	d, err := g.buffer("clip.d", 4*n*k)
	if err != nil {
		return ClipResult{}, err
	}
	e, err := g.buffer("clip.e", 4*groups*n*t)
	if err != nil {
		return ClipResult{}, err
	}
	pairs := n * groups
	state, err := g.buffer("clip.state", pairs*(8+8+4+4)) // err0, best (float64), absmax, bestMax
	if err != nil {
		return ClipResult{}, err
	}
	err0, best, absmax, bestMax := state, state.Add(8*pairs), state.Add(16*pairs), state.Add(20*pairs)
	grid, steps := opt.clipSteps()
	for step := range steps {
		shrink := float32(1 - float64(step)/float64(grid))
		am := cuda.DevicePtr(0)
		if step == 0 {
			am = absmax
		}
		if err := g.fakeQuantDiff(wd, 0, d, am, n, k, *l.Scheme, shrink); err != nil {
			return ClipResult{}, err
		}
		if err := g.groupGEMMs(e, d, x, n, k, gs, t, stride*k); err != nil {
			return ClipResult{}, err
		}
		if err := launch1D(g.fn.groupErrors, pairs, g.stream, e, int32(n), int32(groups), int32(t), absmax, shrink,
			int32(step), err0, best, bestMax); err != nil {
			return ClipResult{}, err
		}
	}
	errs, err := download[float64](g, err0, 2*pairs) // err0 then best
	if err != nil {
		return ClipResult{}, err
	}
	maxes, err := download[float32](g, absmax, pairs)
	if err != nil {
		return ClipResult{}, err
	}
	limits, err := download[float32](g, bestMax, pairs)
	if err != nil {
		return ClipResult{}, err
	}
	var res ClipResult
	for i := range pairs {
		res.Err0 += errs[i]
		res.Err += errs[pairs+i]
		if limits[i] < maxes[i] {
			res.Clipped++
		}
	}
	res.Err /= float64(pairs)
	res.Err0 /= float64(pairs)
	clampGroups(l.W, n, k, gs, limits, 1)
	return res, nil
}

// groupGEMMs sets e_g [n, t] (column-major, at e + g·n·t) = D_g · X_gᵀ for every group g of gs
// columns: the partial dot products of each output row's group with each sampled token, whose
// rows are ld floats apart in x.
func (g *GPUSearch) groupGEMMs(e, d, x cuda.DevicePtr, n, k, gs, t, ld int) error {
	full := k / gs
	if full > 0 {
		if err := g.blas.SgemmStridedBatched(cuda.Trans, cuda.NoTrans, n, t, gs, 1, d, k, gs, x, ld, gs, 0, e, n, n*t, full); err != nil {
			return err
		}
	}
	if tail := k - full*gs; tail > 0 {
		off := full * gs
		return g.blas.Sgemm(cuda.Trans, cuda.NoTrans, n, t, tail, 1, d.Add(4*off), k, x.Add(4*off), ld, 0, e.Add(4*full*n*t), n)
	}
	return nil
}

// sampling is sampleRows' choice: every stride-th row, t of them.
func sampling(rows, limit int) (stride, t int) {
	stride = max(rows/limit, 1)
	if stride == 1 && rows <= limit {
		return 1, rows
	}
	return stride, min(limit, (rows+stride-1)/stride)
}

// GatherRows queues on st the copy of rows first, first+stride, … (count of them) of x [·, cols]
// (device) to dst.
func (g *GPUSearch) GatherRows(dst, x cuda.DevicePtr, cols, first, stride, count int, st cuda.Stream) error {
	if count <= 0 {
		return nil
	}
	return launch1D(g.fn.gatherRows, count*cols, st, dst, x, int32(cols), int64(first), int64(stride), int64(count))
}

// DivideColumns divides column c of x [rows, cols] (device) by s[c], on the search's stream.
func (g *GPUSearch) DivideColumns(x cuda.DevicePtr, rows, cols int, s []float32) error {
	sd, err := g.upload("divide.s", s)
	if err != nil {
		return err
	}
	return launch1D(g.fn.divideColumns, rows*cols, g.stream, x, sd, int64(rows), int32(cols))
}

// Synchronize waits for the search's queued work.
func (g *GPUSearch) Synchronize() error { return g.dev.SynchronizeStream(g.stream) }

// Device is the GPU the search runs on.
func (g *GPUSearch) Device() *cuda.Device { return g.dev }
