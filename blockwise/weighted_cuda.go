package blockwise

import (
	_ "embed"
	"fmt"
	"sync"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/quant"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/weighted.cu

var (
	//go:embed kernels/weighted.ptx
	weightedPTX []byte
	//go:embed kernels/weighted.cu
	weightedSource []byte
)

// GPUImatrix runs the importance-weighted search (Options.Imatrix) of integer-grid groups
// on a GPU, one thread per group (kernels/weighted.cu): the scales and zero points the CPU's
// search finds, bit for bit, at GPU speed. Quantize then encodes with them (Options.Params).
// It is safe for concurrent use; calls run one at a time.
type GPUImatrix struct {
	mu     sync.Mutex
	dev    *cuda.Device
	mod    *cuda.Module
	fn     cuda.Function
	stream cuda.Stream
}

// NewGPUImatrix loads the kernel on dev.
func NewGPUImatrix(dev *cuda.Device) (*GPUImatrix, error) { return newGPUImatrix(dev, weightedPTX) }

func newGPUImatrix(dev *cuda.Device, ptx []byte) (*GPUImatrix, error) {
	m, err := dev.LoadModule(ptx)
	if err != nil {
		return nil, fmt.Errorf("blockwise: loading kernels/weighted.ptx: %w", err)
	}
	fn, err := m.Function("weighted_params")
	if err == nil {
		var s cuda.Stream
		if s, err = dev.NewStream(); err == nil {
			return &GPUImatrix{dev: dev, mod: m, fn: fn, stream: s}, nil
		}
	}
	m.Unload()
	return nil, err
}

// Close releases the kernel and its stream.
func (g *GPUImatrix) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	err := g.dev.DestroyStream(g.stream)
	if uerr := g.mod.Unload(); err == nil {
		err = uerr
	}
	return err
}

// Supports reports whether the search of scheme s runs here: integer grids.
func (g *GPUImatrix) Supports(s quant.Scheme) bool {
	return s.Grid == quant.Integer && s.Validate() == nil
}

// Params returns the parameters the imatrix search gives every group of W[n, k] (float32,
// row-major) under scheme s, with per-input-channel importance imp (len k, or nil for plain
// squared error). W must be finite (Quantize reports where it is not).
func (g *GPUImatrix) Params(w []float32, n, k int, s quant.Scheme, imp []float32) (*FittedGroups, error) {
	if !g.Supports(s) {
		return nil, fmt.Errorf("blockwise: the GPU search takes integer grids, not %s", s)
	}
	if err := checkArgs(n, k, s, Options{Imatrix: true, Importance: imp}); err != nil {
		return nil, err
	}
	if len(w) != n*k {
		return nil, fmt.Errorf("blockwise: %d weights for a %dx%d tensor", len(w), n, k)
	}
	if i := firstNonFinite(w); i >= 0 {
		return nil, fmt.Errorf("weight at row %d, column %d is %g", i/k, i%k, w[i])
	}
	groups := s.Groups(k)
	out := &FittedGroups{Scales: make([]float32, n*groups), Zeros: make([]uint8, n*groups)}
	g.mu.Lock()
	defer g.mu.Unlock()
	bufs, err := g.upload(w, imp, len(out.Scales))
	if err != nil {
		return nil, err
	}
	defer g.free(bufs)
	const threads = 128
	blocks := (n*groups + threads - 1) / threads
	if err := g.fn.Launch(cuda.Dim3{X: blocks, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, g.stream,
		bufs[0], bufs[1], int32(n), int32(k), int32(groupLen(s, k)), int32(groups), int32(s.Bits), boolArg(s.Sym), bufs[2], bufs[3]); err != nil {
		return nil, err
	}
	if err := g.dev.SynchronizeStream(g.stream); err != nil {
		return nil, err
	}
	if err := g.dev.CopyFromDevice(cuda.Bytes(out.Scales), bufs[2]); err != nil {
		return nil, err
	}
	return out, g.dev.CopyFromDevice(out.Zeros, bufs[3])
}

// upload allocates the kernel's buffers — weights, importance (0 when nil), scales, zero
// points — and copies the inputs in. The caller frees them.
func (g *GPUImatrix) upload(w, imp []float32, ng int) ([]cuda.DevicePtr, error) {
	var bufs []cuda.DevicePtr
	fail := func(err error) ([]cuda.DevicePtr, error) {
		g.free(bufs)
		return nil, err
	}
	for _, size := range []int{4 * len(w), 4 * len(imp), 4 * ng, ng} {
		var p cuda.DevicePtr
		if size > 0 {
			var err error
			if p, err = g.dev.Alloc(size); err != nil {
				return fail(err)
			}
		}
		bufs = append(bufs, p)
	}
	if err := g.dev.CopyToDevice(bufs[0], cuda.Bytes(w)); err != nil {
		return fail(err)
	}
	if imp != nil {
		if err := g.dev.CopyToDevice(bufs[1], cuda.Bytes(imp)); err != nil {
			return fail(err)
		}
	}
	return bufs, nil
}

func (g *GPUImatrix) free(bufs []cuda.DevicePtr) {
	for _, p := range bufs {
		if p != 0 {
			g.dev.Free(p)
		}
	}
}

func boolArg(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
