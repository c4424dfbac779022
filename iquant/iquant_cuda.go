package iquant

import (
	_ "embed"
	"fmt"
	"math"
	"sync"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/iquant.cu

var (
	//go:embed kernels/iquant.ptx
	iquantPTX []byte
	//go:embed kernels/iquant.cu
	iquantSource []byte
)

// GPUFitter fits whole IQ tensors on a GPU: every block by Type.Fit's algorithm, one GPU thread
// per block (kernels/iquant.cu), giving the tensor Quantize gives on the CPU, bit for bit. A
// thread cannot see the state ggml carries from one block of a row to the next, which matters
// only for sub-blocks without weighted values (all importance zero) or all-zero IQ1 sub-blocks:
// the kernel flags such blocks, and their rows are fitted again on the CPU, as are rows the CPU
// refuses (their error is the CPU's). It is safe for concurrent use; calls run one at a time.
type GPUFitter struct {
	mu     sync.Mutex
	dev    *cuda.Device
	mod    *cuda.Module
	fn     cuda.Function
	stream cuda.Stream
	stager *cuda.Stager // weights go up through pinned memory (cuda.Stager says why)
	tables map[quant.IQType]*gpuLattice
	// CPURows counts the rows fitted again on the CPU (tests, logs).
	CPURows int
}

// gpuLattice is a grid's search tables on the GPU.
type gpuLattice struct {
	lat                              *lattice
	levels, coords, kmap, neighbours cuda.DevicePtr
}

// NewGPUFitter loads the kernel on dev.
func NewGPUFitter(dev *cuda.Device) (*GPUFitter, error) { return newGPUFitter(dev, iquantPTX) }

func newGPUFitter(dev *cuda.Device, ptx []byte) (*GPUFitter, error) {
	m, err := dev.LoadModule(ptx)
	if err != nil {
		return nil, fmt.Errorf("iquant: loading kernels/iquant.ptx: %w", err)
	}
	g := &GPUFitter{dev: dev, mod: m, tables: map[quant.IQType]*gpuLattice{}}
	if g.fn, err = m.Function("iquant_fit"); err != nil {
		m.Unload()
		return nil, err
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

// Close releases the kernel, the tables, the stream and the pinned memory.
func (g *GPUFitter) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var err error
	if g.stager != nil {
		err = g.stager.Close()
	}
	for _, t := range g.tables {
		for _, p := range []cuda.DevicePtr{t.levels, t.coords, t.kmap, t.neighbours} {
			g.dev.Free(p)
		}
	}
	if serr := g.dev.DestroyStream(g.stream); err == nil {
		err = serr
	}
	if uerr := g.mod.Unload(); err == nil {
		err = uerr
	}
	return err
}

// Supports reports whether scheme s is fitted here: every IQ type.
func (g *GPUFitter) Supports(s quant.Scheme) bool {
	_, err := TypeOf(s)
	return err == nil
}

// Quantize fits every block of W[n, k] (float32, row-major) in IQ scheme s with per-input-channel
// importance imp (len k; nil for none) and returns the tensor Quantize gives on the CPU, or its
// error.
func (g *GPUFitter) Quantize(w []float32, n, k int, s quant.Scheme, imp []float32) (*quant.Tensor, error) {
	return fitTensor(w, n, k, s, imp, func(t *Type, q *quant.Tensor, flags []uint8) error {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.run(t, q, w, imp, flags)
	}, &g.CPURows)
}

// fitTensor checks a whole tensor's arguments, has run fit every block of q (as the kernel
// does, flags one per block) and fits again on the CPU the rows that need it: rows with a
// non-finite weight, with a flagged block or with a non-finite d, in order, so that the first
// error is the CPU's for the lowest failing row. cpuRows counts them.
func fitTensor(w []float32, n, k int, s quant.Scheme, imp []float32, run func(t *Type, q *quant.Tensor, flags []uint8) error, cpuRows *int) (*quant.Tensor, error) {
	t, err := checkTensor(w, n, k, s, imp)
	if err != nil {
		return nil, err
	}
	q := quant.NewIQuantTensor(s, n, k)
	if (imp == nil && t.Imatrix) || !validImportance(imp) {
		// what every row refuses (bad importance, or none): the CPU's error for row 0
		return nil, fmt.Errorf("row 0, %w", t.QuantizeRow(q, 0, w[:k], imp))
	}
	flags := make([]uint8, n*k/t.Block)
	if err := run(t, q, flags); err != nil {
		return nil, err
	}
	perRow := k / t.Block
	for r := range n {
		redo := fp.FirstNonFinite(w[r*k:(r+1)*k]) >= 0
		for b := r * perRow; b < (r+1)*perRow && !redo; b++ {
			redo = flags[b] != 0 || math.IsInf(float64(q.Scales[b]), 0) || q.Scales[b] != q.Scales[b]
		}
		if !redo {
			continue
		}
		*cpuRows++
		if err := t.QuantizeRow(q, r, w[r*k:(r+1)*k], imp); err != nil {
			return nil, fmt.Errorf("row %d, %w", r, err)
		}
	}
	return q, nil
}

func validImportance(imp []float32) bool {
	for _, v := range imp {
		if !(v >= 0) || math.IsInf(float64(v), 1) {
			return false
		}
	}
	return true
}

// kernelOutputs are the slices of q the kernel writes, in its argument order: d, sub-block
// scales, grid points, signs, codes (empty ones: null pointers).
func kernelOutputs(q *quant.Tensor) [][]byte {
	return [][]byte{cuda.Bytes(q.Scales), cuda.Bytes(q.SubScales), cuda.Bytes(q.Points), q.Signs, q.Codes}
}

// run uploads the weights and importance, fits on the GPU and downloads the tensor's fields
// and the block flags.
func (g *GPUFitter) run(t *Type, q *quant.Tensor, w, imp []float32, flags []uint8) error {
	var lat gpuLattice
	if t.lat != nil {
		tab, err := g.lattice(t)
		if err != nil {
			return err
		}
		lat = *tab
	}
	in, out := [][]byte{cuda.Bytes(w), cuda.Bytes(imp)}, append(kernelOutputs(q), flags)
	ptrs, err := g.dev.AllocFor(append(in, out...))
	if err != nil {
		return err
	}
	defer g.dev.FreeAll(ptrs)
	for i, b := range out {
		if len(b) > 0 {
			if err := g.dev.Fill32(ptrs[2+i], 0, (len(b)+3)/4); err != nil {
				return err
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
	const threads = 64
	blocks := (len(flags) + threads - 1) / threads
	shift := 0
	if lat.lat != nil {
		shift = lat.lat.shift
	}
	if err := g.fn.Launch(cuda.Dim3{X: blocks, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, g.stream,
		int32(t.Type), ptrs[0], ptrs[1], int32(q.N), int32(q.K), lat.levels, lat.coords, lat.kmap, lat.neighbours,
		int32(t.Dim), int32(shift), ptrs[2], ptrs[3], ptrs[4], ptrs[5], ptrs[6], ptrs[7]); err != nil {
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

// lattice uploads t's search tables on first use.
func (g *GPUFitter) lattice(t *Type) (*gpuLattice, error) {
	if tab, ok := g.tables[t.Type]; ok {
		return tab, nil
	}
	lat := t.lat()
	bufs := latticeBytes(lat)
	ptrs, err := g.dev.AllocFor(bufs)
	if err != nil {
		return nil, err
	}
	for i, b := range bufs {
		if err := g.dev.CopyToDevice(ptrs[i], b); err != nil {
			g.dev.FreeAll(ptrs)
			return nil, err
		}
	}
	tab := &gpuLattice{lat: lat, levels: ptrs[0], coords: ptrs[1], kmap: ptrs[2], neighbours: ptrs[3]}
	g.tables[t.Type] = tab
	return tab, nil
}

// latticeBytes are the tables the kernel reads, in its argument order.
func latticeBytes(lat *lattice) [][]byte {
	return [][]byte{cuda.Bytes(lat.levels), cuda.Bytes(lat.coords), cuda.Bytes(lat.kmap), cuda.Bytes(lat.neighbours)}
}
