package kquant

import (
	_ "embed"
	"fmt"
	"sync"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/kquant.cu

var (
	//go:embed kernels/kquant.ptx
	kquantPTX []byte
	//go:embed kernels/kquant.cu
	kquantSource []byte
)

// GPUFitter fits whole k-quant tensors on a GPU: every super-block by Type.Fit's algorithm, one
// GPU thread per super-block (kernels/kquant.cu), giving the codes and parameters QuantizeRow
// gives on the CPU, bit for bit. It is safe for concurrent use; calls run one at a time.
type GPUFitter struct {
	mu     sync.Mutex
	dev    *cuda.Device
	mod    *cuda.Module
	fns    map[int]cuda.Function // by code width
	stream cuda.Stream
	stager *cuda.Stager // weights go up through pinned memory (cuda.Stager says why)
	poison bool         // tests: fill the outputs with garbage before each launch
}

// NewGPUFitter loads the kernels on dev.
func NewGPUFitter(dev *cuda.Device) (*GPUFitter, error) { return newGPUFitter(dev, kquantPTX) }

func newGPUFitter(dev *cuda.Device, ptx []byte) (*GPUFitter, error) {
	m, err := dev.LoadModule(ptx)
	if err != nil {
		return nil, fmt.Errorf("kquant: loading kernels/kquant.ptx: %w", err)
	}
	g := &GPUFitter{dev: dev, mod: m, fns: map[int]cuda.Function{}}
	for bits := range types {
		if g.fns[bits], err = m.Function(fmt.Sprintf("kquant_fit_q%d_k", bits)); err != nil {
			m.Unload()
			return nil, err
		}
	}
	if g.stream, err = dev.NewStream(); err != nil {
		m.Unload()
		return nil, err
	}
	if g.stager, err = dev.NewStager(cuda.DefaultStagingBytes); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// Close releases the kernels, the stream and the pinned memory.
func (g *GPUFitter) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var err error
	if g.stager != nil {
		err = g.stager.Close()
	}
	if serr := g.dev.DestroyStream(g.stream); err == nil {
		err = serr
	}
	if uerr := g.mod.Unload(); err == nil {
		err = uerr
	}
	return err
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
	return fitTensor(w, n, k, s, imp, func(kt *Type, q *quant.Tensor) error {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.run(kt, q, w, imp)
	})
}

// fitTensor checks a whole tensor's arguments, has run fit q (as the kernels do) and checks the
// fitted super-block scales.
func fitTensor(w []float32, n, k int, s quant.Scheme, imp []float32, run func(kt *Type, q *quant.Tensor) error) (*quant.Tensor, error) {
	kt, err := TypeOf(s)
	if err != nil {
		return nil, err
	}
	if err := kt.checkTensor(w, n, k, imp); err != nil {
		return nil, err
	}
	q := quant.NewKQuantTensor(s, n, k)
	if err := run(kt, q); err != nil {
		return nil, err
	}
	return q, kt.checkScales(q)
}

// kernelOutputs are the slices of q the kernels write, in their argument order: codes, d, dmin,
// sub-block scales and mins (dmin and mins empty for q3_k and q6_k: null pointers).
func kernelOutputs(q *quant.Tensor) [][]byte {
	return [][]byte{q.Codes, cuda.Bytes(q.Scales), cuda.Bytes(q.Mins), cuda.Bytes(q.SubScales), q.SubMins}
}

// run uploads the weights and importance, fits on the GPU and downloads the tensor's codes and
// parameters into q.
func (g *GPUFitter) run(kt *Type, q *quant.Tensor, w, imp []float32) error {
	in, out := [][]byte{cuda.Bytes(w), cuda.Bytes(imp)}, kernelOutputs(q)
	ptrs, err := g.dev.AllocFor(append(in, out...))
	if err != nil {
		return err
	}
	defer g.dev.FreeAll(ptrs)
	if g.poison {
		for i, b := range out {
			if len(b) > 0 {
				if err := g.dev.Fill32(ptrs[2+i], 0x7fc0dead, (len(b)+3)/4); err != nil {
					return err
				}
			}
		}
	}
	for i, b := range in {
		if len(b) > 0 {
			if err := g.stager.CopyToDevice(ptrs[i], b, g.stream); err != nil {
				return err
			}
		}
	}
	const threads = 128
	blocks := (q.N*q.Scheme.SuperBlocks(q.K) + threads - 1) / threads
	if err := g.fns[kt.Bits].Launch(cuda.Dim3{X: blocks, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, g.stream,
		ptrs[0], ptrs[1], int32(q.N), int32(q.K), ptrs[2], ptrs[3], ptrs[4], ptrs[5], ptrs[6]); err != nil {
		return err
	}
	if err := g.dev.SynchronizeStream(g.stream); err != nil {
		return err
	}
	for i, b := range out {
		if len(b) > 0 {
			if err := g.dev.CopyFromDevice(b, ptrs[2+i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkTensor checks W[n, k] and its importance before a whole tensor is fitted at once, with
// the errors the CPU path gives for the first bad weight or importance.
func (t *Type) checkTensor(w []float32, n, k int, imp []float32) error {
	if n <= 0 || k <= 0 || len(w) != n*k {
		return fmt.Errorf("kquant: %d weights for a %dx%d tensor", len(w), n, k)
	}
	if err := t.Scheme.CheckRowLength(k); err != nil {
		return fmt.Errorf("kquant: %w", err)
	}
	if imp != nil && len(imp) != k {
		return fmt.Errorf("kquant: %d importance weights for %d input channels", len(imp), k)
	}
	if i := fp.FirstNonFinite(w); i >= 0 {
		return fmt.Errorf("weight at row %d, column %d is %g", i/k, i%k, w[i])
	}
	for i, v := range imp {
		if badImportance(v) {
			return fmt.Errorf("importance of input channel %d is %g; want finite and ≥ 0", i, v)
		}
	}
	return nil
}

// checkScales refuses a fitted tensor with a super-block scale beyond F16, naming the first such
// super-block as QuantizeRow's errors do (after the row).
func (t *Type) checkScales(q *quant.Tensor) error {
	blocks := q.Scheme.SuperBlocks(q.K)
	for i, d := range q.Scales {
		var dmin float32
		if t.Mins {
			dmin = q.Mins[i]
		}
		if err := checkScale(d, dmin); err != nil {
			return fmt.Errorf("row %d, %w", i/blocks, t.blockError(q.K, i%blocks, err))
		}
	}
	return nil
}
