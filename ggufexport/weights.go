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
	roles map[string]slot // Hugging Face name → where it is stored
}

// slot is a Hugging Face tensor's place in the file: its role, and for an expert its index in
// the merged tensor.
type slot struct {
	role
	expert int
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
	w := &Weights{f: f, roles: map[string]slot{}}
	arch := w.arch()
	mixtral := func(string) bool { return arch == "llama" } // experts under Mixtral's names
	for _, r := range roles(arch, cfg, mixtral) {
		w.roles[r.hf] = slot{role: r}
		for e, hf := range r.experts {
			w.roles[hf] = slot{role: r, expert: e}
		}
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

func (w *Weights) info(name string) (slot, gguf.TensorInfo, bool) {
	r, ok := w.roles[name]
	if !ok || (r.hf == "" && r.experts == nil) {
		return slot{}, gguf.TensorInfo{}, false
	}
	t, ok := w.f.Tensor(r.gguf)
	return r, t, ok
}

// Shape returns the tensor's PyTorch shape (an expert's [N, K] within its merged tensor).
func (w *Weights) Shape(name string) ([]int, bool) {
	r, t, ok := w.info(name)
	if !ok {
		return nil, false
	}
	dims := t.Dims
	switch {
	case r.experts != nil:
		dims = dims[:2]
	case r.flat:
		dims = append(dims, 1)
	}
	shape := make([]int, len(dims))
	for i, d := range dims {
		shape[len(dims)-1-i] = int(d)
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
	if r.experts != nil {
		size := int(t.Dims[1]) * t.Type.RowBytes(int(t.Dims[0]))
		b = b[r.expert*size : (r.expert+1)*size]
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
