// Package ggufexport writes a Hugging Face checkpoint, plain or quantized, as a GGUF file with
// llama.cpp's tensor names, metadata and tokenizer, and reads such a file back as weights.
package ggufexport

import (
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quantized"
)

// Options say how tensors are stored. The zero value writes float linear weights in F16.
type Options struct {
	// Type is the ggml type of linear weights stored as floats in the source ("" = F16).
	Type string
	// EmbedType is the type of token_embd and output ("" = F16).
	EmbedType string
	// Requantize allows quantized modules whose scheme maps onto no ggml type to be
	// dequantized and quantized again to Type (lossy, and reported as such).
	Requantize bool
	// TokenizerPre overrides tokenizer.ggml.pre.
	TokenizerPre string
	// Name is general.name ("" = the source directory's name).
	Name string
}

// Entry tells how one tensor was written.
type Entry struct {
	Name string
	Type gguf.Type
	How  string // "repacked losslessly (q4_k)", "quantized", "dequantized and requantized (lossy, from …)", …
}

// Export writes the checkpoint at src as a GGUF v3 file at dst and returns what it did per
// tensor. Nothing is written at dst unless the whole file is.
func Export(src, dst string, o Options) ([]Entry, error) {
	cfg, err := model.LoadConfig(src)
	if err != nil {
		return nil, err
	}
	arch, ok := archOf[cfg.ModelType]
	if !ok {
		types := slices.Sorted(maps.Keys(archOf))
		return nil, fmt.Errorf("%s: model_type %q has no GGUF export (%s do)", src, cfg.ModelType, strings.Join(types, ", "))
	}
	extra, err := readExtraConfig(src)
	if err != nil {
		return nil, err
	}
	kvs, err := hyperparameters(arch, cfg, extra)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	tokKVs, err := tokenizerKVs(src, cfg.Vocab, extra, o.TokenizerPre)
	if err != nil {
		return nil, err
	}
	c, err := quantized.Open(src)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	p := planner{c: c, opts: o}
	if p.linear, err = parseType(o.Type, "--type"); err != nil {
		return nil, err
	}
	if p.embed, err = parseType(o.EmbedType, "--embed-type"); err != nil {
		return nil, err
	}
	tensors, entries, err := p.tensors(arch, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	name := o.Name
	if name == "" {
		name = filepath.Base(filepath.Clean(src))
	}
	head := []gguf.KV{
		{Key: "general.architecture", Value: arch},
		{Key: "general.name", Value: name},
		{Key: "general.file_type", Value: fileType(entries)},
		{Key: "general.quantization_version", Value: uint32(2)},
	}
	kvs = append(append(head, kvs...), tokKVs...)
	if err := gguf.Write(dst, kvs, tensors); err != nil {
		return nil, err
	}
	return entries, nil
}

func parseType(s, flag string) (gguf.Type, error) {
	if s == "" {
		return gguf.F16, nil
	}
	t, err := gguf.ParseType(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", flag, err)
	}
	if _, ok := kquantFor(t); ok || slices.Contains(gguf.Encoders, t) {
		return t, nil
	}
	return 0, fmt.Errorf("%s %s: qpack quantizes float weights to %v and Q2_K … Q6_K", flag, t, gguf.Encoders)
}

// fileType is general.file_type (llama.h LLAMA_FTYPE_*) of the type most linear weights use.
func fileType(entries []Entry) uint32 {
	ftype := map[gguf.Type]uint32{gguf.F32: 0, gguf.F16: 1, gguf.Q4_0: 2, gguf.Q4_1: 3, gguf.Q8_0: 7,
		gguf.Q5_0: 8, gguf.Q5_1: 9, gguf.Q2_K: 10, gguf.Q3_K: 12, gguf.Q4_K: 15, gguf.Q5_K: 17, gguf.Q6_K: 18, gguf.BF16: 32}
	count := map[gguf.Type]int{}
	best := gguf.F32
	for _, e := range entries {
		if strings.HasPrefix(e.Name, "blk.") && strings.HasSuffix(e.Name, ".weight") && e.Type != gguf.F32 {
			count[e.Type]++
			if count[e.Type] > count[best] {
				best = e.Type
			}
		}
	}
	return ftype[best]
}

// planner decides each tensor's type and source and builds its writer.
type planner struct {
	c             *quantized.Checkpoint
	opts          Options
	linear, embed gguf.Type
}

func (p *planner) tensors(arch string, cfg *model.Config) ([]gguf.Tensor, []Entry, error) {
	var out []gguf.Tensor
	var entries []Entry
	add := func(t gguf.Tensor, how string) {
		out = append(out, t)
		entries = append(entries, Entry{t.Name, t.Type, how})
	}
	if cfg.Rope.Type == "llama3" {
		f := ropeFactors(cfg)
		add(floatTensor("rope_freqs.weight", gguf.F32, f, []int{len(f)}), "computed (llama3 rope)")
	}
	has := func(name string) bool { _, ok := p.c.Shape(name); return ok }
	for _, r := range roles(arch, cfg, has) {
		t, how, err := p.tensor(r)
		if err != nil {
			return nil, nil, err
		}
		if t.Name != "" {
			add(t, how)
		}
	}
	return out, entries, nil
}

// tensor plans one role; an absent optional tensor returns a zero Tensor.
func (p *planner) tensor(r role) (gguf.Tensor, string, error) {
	if r.experts != nil {
		return p.merged(r)
	}
	prefix := strings.TrimSuffix(r.hf, ".weight")
	if r.linear {
		if p.c.Format != nil && p.c.IsModule(prefix) {
			return p.module(r, prefix)
		}
	}
	shape, ok := p.c.Shape(r.hf)
	if !ok {
		if r.optional {
			return gguf.Tensor{}, "", nil
		}
		return gguf.Tensor{}, "", fmt.Errorf("tensor %s (for %s) is missing", r.hf, r.gguf)
	}
	typ := gguf.F32 // norms, biases, routers
	switch {
	case r.f32:
	case r.linear:
		typ = p.linear
	case len(shape) == 2:
		typ = p.embed
	}
	if err := checkRows(r, shape, typ); err != nil {
		return gguf.Tensor{}, "", err
	}
	if r.flat {
		if len(shape) != 2 || shape[0] != 1 {
			return gguf.Tensor{}, "", fmt.Errorf("tensor %s has shape %v; [1, K] expected for %s", r.hf, shape, r.gguf)
		}
		shape = shape[1:]
	}
	load := func() ([]float32, error) { return p.c.Float32(r.hf) }
	how := "converted"
	if typ.BlockSize() > 1 {
		how = "quantized"
	}
	return lazyFloatTensor(r, typ, shape, load), how, nil
}

func checkRows(r role, shape []int, typ gguf.Type) error {
	if len(shape) < 1 || len(shape) > 2 {
		return fmt.Errorf("tensor %s has shape %v; 1 or 2 dimensions expected", r.hf, shape)
	}
	if k := shape[len(shape)-1]; k%typ.BlockSize() != 0 {
		return fmt.Errorf("tensor %s: rows of %d values are not whole %s blocks of %d; choose a type with a block size dividing %d (F16, F32)", r.hf, k, typ, typ.BlockSize(), k)
	}
	if r.heads > 0 && shape[0]%(2*r.heads) != 0 {
		return fmt.Errorf("tensor %s: %d rows do not split into %d heads of even size", r.hf, shape[0], r.heads)
	}
	return nil
}

// dims turns a PyTorch shape into GGUF dims, innermost first.
func dims(shape []int) []uint64 {
	d := make([]uint64, len(shape))
	for i, s := range shape {
		d[len(shape)-1-i] = uint64(s)
	}
	return d
}

// lazyFloatTensor reads the float tensor only when it is written, permutes its rows when
// the role asks, and encodes it row by row.
func lazyFloatTensor(r role, typ gguf.Type, shape []int, load func() ([]float32, error)) gguf.Tensor {
	return gguf.Tensor{Name: r.gguf, Type: typ, Dims: dims(shape), WriteTo: func(w io.Writer) error {
		v, err := load()
		if err != nil {
			return err
		}
		return writeFloatRows(w, typ, v, shape, r.heads)
	}}
}

func floatTensor(name string, typ gguf.Type, v []float32, shape []int) gguf.Tensor {
	return gguf.Tensor{Name: name, Type: typ, Dims: dims(shape), WriteTo: func(w io.Writer) error {
		return writeFloatRows(w, typ, v, shape, 0)
	}}
}

func writeFloatRows(w io.Writer, typ gguf.Type, v []float32, shape []int, heads int) error {
	k := shape[len(shape)-1]
	rows := len(v) / k
	src := identityRows(rows)
	if heads > 0 {
		src = permuteRows(rows, heads)
	}
	var buf []byte
	for _, r := range src {
		var err error
		if buf, err = encodeRow(buf[:0], typ, v[r*k:(r+1)*k]); err != nil {
			return fmt.Errorf("row %d: %w", r, err)
		}
		if _, err := w.Write(buf); err != nil {
			return err
		}
	}
	return nil
}

func identityRows(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// writeByteRows writes rows of encoded blocks, permuted when heads > 0: a row of blocks
// encodes one weight row independently, so moving whole rows is exact.
func writeByteRows(w io.Writer, b []byte, rowBytes, heads int) error {
	rows := len(b) / rowBytes
	if heads == 0 {
		_, err := w.Write(b)
		return err
	}
	for _, r := range permuteRows(rows, heads) {
		if _, err := w.Write(b[r*rowBytes : (r+1)*rowBytes]); err != nil {
			return err
		}
	}
	return nil
}
