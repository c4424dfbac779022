package ggufexport

import (
	"fmt"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/model"
)

// Weights reads an exported GGUF file back under Hugging Face names for qpack's model
// engine: each tensor decoded to float32 and llama's q/k rows put back in Hugging Face order.
// It is how tests check an export end to end, and lets qpack evaluate a GGUF file.
type Weights struct {
	f     *gguf.File
	roles map[string]role // Hugging Face name → role
}

// OpenWeights opens a GGUF file written for the architecture of cfg.
func OpenWeights(path string, cfg *model.Config) (*Weights, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	v, _ := f.Get("general.architecture")
	arch, _ := v.(string)
	if want := archOf[cfg.ModelType]; arch != want {
		f.Close()
		return nil, fmt.Errorf("%s: architecture %q, the config says %q", path, arch, want)
	}
	return newWeights(f, cfg), nil
}

func newWeights(f *gguf.File, cfg *model.Config) *Weights {
	w := &Weights{f: f, roles: map[string]role{}}
	for _, r := range roles(w.arch(), cfg) {
		w.roles[r.hf] = r
	}
	return w
}

// Close closes the file.
func (w *Weights) Close() error { return w.f.Close() }

// arch is the file's llama.cpp architecture name.
func (w *Weights) arch() string {
	v, _ := w.f.Get("general.architecture")
	s, _ := v.(string)
	return s
}

func (w *Weights) info(name string) (role, gguf.TensorInfo, bool) {
	r, ok := w.roles[name]
	if !ok {
		return role{}, gguf.TensorInfo{}, false
	}
	t, ok := w.f.Tensor(r.gguf)
	return r, t, ok
}

// Shape returns the tensor's PyTorch shape.
func (w *Weights) Shape(name string) ([]int, bool) {
	_, t, ok := w.info(name)
	if !ok {
		return nil, false
	}
	shape := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		shape[len(t.Dims)-1-i] = int(d)
	}
	return shape, true
}

// Float32 decodes a tensor.
func (w *Weights) Float32(name string) ([]float32, error) {
	r, t, ok := w.info(name)
	if !ok {
		return nil, fmt.Errorf("%s: no tensor for %s", w.f.Path, name)
	}
	b, err := w.f.Bytes(t)
	if err != nil {
		return nil, err
	}
	v, err := decode(t, b)
	if err != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", w.f.Path, t.Name, err)
	}
	if r.heads == 0 {
		return v, nil
	}
	k := int(t.Dims[0])
	out := make([]float32, len(v))
	for dst, src := range permuteRows(len(v)/k, r.heads) {
		copy(out[src*k:(src+1)*k], v[dst*k:(dst+1)*k])
	}
	return out, nil
}
