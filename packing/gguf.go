package packing

import (
	"fmt"

	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/quant"
)

// GGUF is llama.cpp's format as an output of convert: every quantized weight is one ggml
// tensor of the type its scheme stands for (package ggmltype: the k-quants, Q8_0, Q5_0, Q4_0),
// its rows as ggml blocks in order. Pack returns that tensor as one U8 [N, row bytes] Raw named
// P.weight; convert writes it, with the rest of the model, into a GGUF file (not a safetensors
// checkpoint), so the format has no reader here and is not in the registry of checkpoint
// layouts (Lookup): qpack reads GGUF files with package ggufexport.
type GGUF struct{}

func (GGUF) Name() string { return "gguf" }

func (GGUF) MixedSchemes() bool { return true }

func (GGUF) Supports(s quant.Scheme) error { return ggmltype.Supports(s) }

func (GGUF) Metadata(string, *quant.Tensor) map[string]string { return nil }

func (GGUF) Pack(prefix string, t *quant.Tensor) ([]Raw, error) {
	typ, b, err := ggmltype.Encode(t)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	return []Raw{ggufRaw(prefix, typ, t.N, t.K, b)}, nil
}

func ggufRaw(prefix string, typ gguf.Type, n, k int, data []byte) Raw {
	return Raw{Name: prefix + ".weight", DType: "U8", Shape: []int{n, typ.RowBytes(k)}, Data: data}
}

// Layout is the Raw that Pack returns for a tensor of n rows of k weights in scheme s, without
// its data: what convert's header needs, without packing a tensor of that size.
func (GGUF) Layout(prefix string, s quant.Scheme, n, k int) (Raw, error) {
	typ, ok := ggmltype.HeldAs(s)
	if !ok {
		return Raw{}, fmt.Errorf("tensor %s: %w", prefix, ggmltype.Supports(s))
	}
	if err := ggmltype.Fits(typ, k); err != nil {
		return Raw{}, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	return ggufRaw(prefix, typ, n, k, nil), nil
}

// Blocks is what Pack returns for a tensor of n rows of k weights in scheme s whose ggml
// blocks are b, made elsewhere (on the GPU, kquant.GPUFitter.FitBlocks).
func (g GGUF) Blocks(prefix string, s quant.Scheme, n, k int, b []byte) ([]Raw, error) {
	r, err := g.Layout(prefix, s, n, k)
	if err != nil {
		return nil, err
	}
	if len(b) != n*r.Shape[1] {
		return nil, fmt.Errorf("tensor %s: %d bytes are not %dx%d weights in ggml's blocks of %s", prefix, len(b), n, k, s)
	}
	r.Data = b
	return []Raw{r}, nil
}

func (GGUF) Unpack(prefix string, _ func(string) (Raw, bool), _ map[string]string) (*quant.Tensor, error) {
	return nil, fmt.Errorf("tensor %s: GGUF tensors are read from GGUF files (package ggufexport), not from safetensors", prefix)
}

// Bytes is the ggml tensor's size, or 0 when rows of k weights are not whole blocks of the
// scheme's type (the planner's Fallback keeps such plans from being made).
func (GGUF) Bytes(s quant.Scheme, n, k int) int64 {
	typ, ok := ggmltype.TypeOf(s)
	if !ok || ggmltype.Fits(typ, k) != nil {
		return 0
	}
	return ggmltype.Bytes(typ, n, k)
}

func (GGUF) TensorNames(prefix string) []string { return []string{prefix + ".weight"} }

func (GGUF) Dims(prefix string, _ func(string) (Raw, bool)) (int, int, error) {
	return 0, 0, fmt.Errorf("tensor %s: GGUF tensors are read from GGUF files (package ggufexport)", prefix)
}
