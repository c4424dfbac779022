// Package ggufexport writes a Hugging Face checkpoint, plain or quantized, as a GGUF file with
// llama.cpp's tensor names, metadata and tokenizer, and reads such a file back as weights.
package ggufexport

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/qpack-dev/qpack/ftype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/quantized"
)

// Options say how tensors are stored. The zero value writes float linear weights in F16.
type Options struct {
	// Type is the ggml type of linear weights stored as floats in the source ("" = F16).
	Type string
	// EmbedType is the type of token_embd ("" = F16).
	EmbedType string
	// OutputType is the type of output, the classifier ("" = EmbedType).
	OutputType string
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
	c, err := quantized.Open(src)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	l, err := NewLayout(src, o.TokenizerPre, func(name string) bool { _, ok := c.Shape(name); return ok })
	if err != nil {
		return nil, err
	}
	p := planner{c: c, opts: o}
	if p.linear, err = parseType(o.Type, "--type"); err != nil {
		return nil, err
	}
	if p.embed, err = parseType(o.EmbedType, "--embed-type"); err != nil {
		return nil, err
	}
	p.output = p.embed
	if o.OutputType != "" {
		if p.output, err = parseType(o.OutputType, "--output-type"); err != nil {
			return nil, err
		}
	}
	tensors, entries, err := p.tensors(l)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	if err := gguf.Write(dst, l.KVs(o.Name, fileType(entries)), tensors); err != nil {
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
	if qt, ok := iquantFor(t); ok && !qt.Imatrix {
		return t, nil
	}
	return 0, fmt.Errorf("%s %s: qpack quantizes float weights to %v, Q2_K … Q6_K and the IQ types that need no importance matrix (IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_S, IQ1_M)", flag, t, gguf.Encoders)
}

// fileType is general.file_type of the type most linear weights use.
func fileType(entries []Entry) ftype.FileType {
	var types []gguf.Type
	for _, e := range entries {
		if strings.HasPrefix(e.Name, "blk.") && strings.HasSuffix(e.Name, ".weight") {
			types = append(types, e.Type)
		}
	}
	return FileTypeOf(types)
}

// FileTypeOf is general.file_type for a file whose block weights have the given types: the
// file type named after the most common one other than F32 (norms).
func FileTypeOf(types []gguf.Type) ftype.FileType {
	count := map[gguf.Type]int{}
	best := gguf.F32
	for _, t := range types {
		if t != gguf.F32 {
			count[t]++
			if count[t] > count[best] || (count[t] == count[best] && t < best) {
				best = t
			}
		}
	}
	return ftype.Mostly(best)
}

// planner decides each tensor's type and source and builds its writer.
type planner struct {
	c             *quantized.Checkpoint
	opts          Options
	linear, embed gguf.Type
	output        gguf.Type
}

func (p *planner) tensors(l *Layout) ([]gguf.Tensor, []Entry, error) {
	var out []gguf.Tensor
	var entries []Entry
	add := func(t gguf.Tensor, how string) {
		out = append(out, t)
		entries = append(entries, Entry{t.Name, t.Type, how})
	}
	if t, ok := l.RopeFreqs(); ok {
		add(t, "computed (llama3 rope)")
	}
	for _, r := range l.roles {
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
	case r.gguf == "output.weight":
		typ = p.output
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

// writeFloatRows encodes the rows of v in typ and writes them in order (permuted when heads > 0),
// a batch of rows at a time with the batch's rows encoded on all cores.
func writeFloatRows(w io.Writer, typ gguf.Type, v []float32, shape []int, heads int) error {
	k := shape[len(shape)-1]
	rows := len(v) / k
	src := identityRows(rows)
	if heads > 0 {
		src = permuteRows(rows, heads)
	}
	const batchValues = 1 << 20
	batch := max(1, batchValues/k)
	encoded := make([][]byte, min(batch, rows))
	for b0 := 0; b0 < rows; b0 += batch {
		part := src[b0:min(b0+batch, rows)]
		workers := min(runtime.GOMAXPROCS(0), len(part))
		errs := make([]error, workers)
		var wg sync.WaitGroup
		for i := range workers {
			wg.Go(func() {
				for j := i * len(part) / workers; j < (i+1)*len(part)/workers; j++ {
					r := part[j]
					if encoded[j], errs[i] = encodeRow(encoded[j][:0], typ, v[r*k:(r+1)*k]); errs[i] != nil {
						errs[i] = fmt.Errorf("row %d: %w", r, errs[i])
						return
					}
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		for _, row := range encoded[:len(part)] {
			if _, err := w.Write(row); err != nil {
				return err
			}
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
