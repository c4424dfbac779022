package model

import (
	"fmt"
	"sync"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/safetensors"
)

// Weights is where a Model reads its tensors from: a safetensors checkpoint, a reader that
// dequantizes a packed checkpoint, or an in-memory map in tests. A block's tensors are read
// several at once: its methods (and Release, Float32Into where it has them) are called from
// several goroutines.
type Weights interface {
	// Float32 returns the tensor converted to float32 (row-major); the model keeps the slice.
	Float32(name string) ([]float32, error)
	// Shape returns the tensor's dimensions and whether it exists.
	Shape(name string) ([]int, bool)
}

// MapWeights is an in-memory Weights: tensor name → data and shape.
type MapWeights struct {
	Data   map[string][]float32
	Shapes map[string][]int
}

// NewMapWeights returns an empty MapWeights.
func NewMapWeights() *MapWeights {
	return &MapWeights{Data: map[string][]float32{}, Shapes: map[string][]int{}}
}

// Set stores a tensor.
func (w *MapWeights) Set(name string, data []float32, shape ...int) {
	w.Data[name], w.Shapes[name] = data, shape
}

func (w *MapWeights) Float32(name string) ([]float32, error) {
	d, ok := w.Data[name]
	if !ok {
		return nil, fmt.Errorf("tensor %q not found", name)
	}
	return d, nil
}

func (w *MapWeights) Shape(name string) ([]int, bool) {
	s, ok := w.Shapes[name]
	return s, ok
}

// releaser is Weights whose tensors can leave the process's resident memory once read
// (safetensors.Checkpoint.Release: memory-mapped pages, which the page cache keeps). The model
// keeps its own float32 copy; without the release, every block read would stay mapped until
// the model closes, and a 7B's 13 GB of mappings made unmapping them and the process's exit
// take a second.
type releaser interface{ Release(name string) }

// intoReader is Weights that can convert a tensor into a slice it is given
// (safetensors.Checkpoint.Float32Into): a released block's memory, reused.
type intoReader interface {
	Float32Into(name string, dst []float32) ([]float32, error)
}

// loadTensor reads a tensor and checks its shape and that every value is finite.
func loadTensor(w Weights, name string, shape ...int) ([]float32, error) {
	return (&tensorReader{w: w}).tensor(name, shape...)
}

// tensorReader reads a block's tensors. With spare set and w an intoReader, each is converted
// into a slice that spare gives (a released block's, of the same length) when it gives one, and
// every slice read is kept in owned, to be given back when the block is released. Fresh memory is
// what reading a block cost: a 7B block's 0.8 GB of new pages took the kernel 0.2 s to fault in
// on 16 cores, held up every other thread of the process that touched its memory map meanwhile,
// and outlasted a block's calibration on four GPUs.
type tensorReader struct {
	w       Weights
	spare   func(n int) []float32 // nil, or a slice of n values to overwrite (nil when it has none)
	readers int                   // how many of a block's linears are read at once (0: blockReaders)
	raw     bool                  // the projections' weights as the checkpoint stores them, where w hands them out
	mu      sync.Mutex            // owned, as a block's tensors are read at once (loadBlock)
	owned   [][]float32
}

func (r *tensorReader) tensor(name string, shape ...int) ([]float32, error) {
	got, ok := r.w.Shape(name)
	if !ok {
		return nil, fmt.Errorf("model: tensor %q not found", name)
	}
	if !sameShape(got, shape) {
		return nil, fmt.Errorf("model: tensor %q has shape %v, want %v", name, got, shape)
	}
	data, err := r.read(name, product(shape))
	if err != nil {
		return nil, fmt.Errorf("model: tensor %q: %w", name, err)
	}
	if rl, ok := r.w.(releaser); ok {
		rl.Release(name)
	}
	if len(data) != product(shape) {
		return nil, fmt.Errorf("model: tensor %q has %d values, shape %v needs %d", name, len(data), shape, product(shape))
	}
	if i := fp.FirstNonFinite(data); i >= 0 {
		return nil, fmt.Errorf("model: tensor %q has a non-finite value %v at index %d", name, data[i], i)
	}
	return data, nil
}

// read converts the tensor of n values into spare memory where it can, else as w does.
func (r *tensorReader) read(name string, n int) ([]float32, error) {
	into, ok := r.w.(intoReader)
	if !ok || r.spare == nil {
		return r.w.Float32(name)
	}
	dst := r.spare(n)
	if dst == nil {
		dst = make([]float32, n)
	}
	data, err := into.Float32Into(name, dst)
	if err == nil {
		r.mu.Lock()
		r.owned = append(r.owned, data)
		r.mu.Unlock()
	}
	return data, err
}

// rawReader is Weights that hand out a tensor's bytes as stored (safetensors.Checkpoint).
type rawReader interface {
	Info(name string) (safetensors.TensorInfo, bool)
	Bytes(name string) ([]byte, error)
}

// rawTensor returns the bytes of a float tensor of the given shape as stored (BF16, F16 or F32;
// F32 checked finite here, the others where the GPU widens them); ok is false where w does not hand them out or stores another type.
func (r *tensorReader) rawTensor(name string, shape ...int) (raw rawWeight, ok bool, err error) {
	rr, can := r.w.(rawReader)
	if !can {
		return rawWeight{}, false, nil
	}
	info, found := rr.Info(name)
	switch {
	case !found:
		return rawWeight{}, false, fmt.Errorf("model: tensor %q not found", name)
	case !sameShape(info.Shape, shape):
		return rawWeight{}, false, fmt.Errorf("model: tensor %q has shape %v, want %v", name, info.Shape, shape)
	case info.DType != safetensors.BF16 && info.DType != safetensors.F16 && info.DType != safetensors.F32:
		return rawWeight{}, false, nil
	}
	data, err := rr.Bytes(name)
	if err != nil {
		return rawWeight{}, false, fmt.Errorf("model: tensor %q: %w", name, err)
	}
	if info.DType == safetensors.F32 { // (BF16 and F16 are checked on the GPU as they are widened: rawArea)
		if i := safetensors.FirstNonFinite(info.DType, data); i >= 0 {
			return rawWeight{}, false, fmt.Errorf("model: tensor %q has a non-finite value at index %d", name, i)
		}
	}
	return rawWeight{data, info.DType}, true, nil
}

// optional is tensor for a tensor that may be absent (biases): nil, nil when it is.
func (r *tensorReader) optional(name string, shape ...int) ([]float32, error) {
	if _, ok := r.w.Shape(name); !ok {
		return nil, nil
	}
	return r.tensor(name, shape...)
}

// loadOptional is loadTensor for a tensor that may be absent (biases): nil, nil when it is.
func loadOptional(w Weights, name string, shape ...int) ([]float32, error) {
	return (&tensorReader{w: w}).optional(name, shape...)
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func product(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
