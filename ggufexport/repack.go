package ggufexport

import (
	"fmt"
	"io"

	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/quant"
)

// lossless names the schemes whose codes and scales are ggml blocks as they are
// (ggmltype.Encode).
const lossless = "q2_k … q6_k → Q2_K … Q6_K, iq1_s … iq4_xs → IQ1_S … IQ4_XS, int8-g32-sym → Q8_0, int5-g32-sym → Q5_0, int4-g32-sym → Q4_0, int4-g32-asym → Q4_1 (when −z·scale is exact in F16), mxfp4 → MXFP4"

func (p *planner) module(r role, prefix string) (gguf.Tensor, string, error) {
	info, err := p.c.Module(prefix)
	if err != nil {
		return gguf.Tensor{}, "", err
	}
	shape := []int{info.N, info.K}
	typ, ok := ggmltype.HeldAs(info.Scheme)
	partial := ok && info.Scheme.Grid == quant.KQuant && info.K%quant.SuperBlock != 0
	if partial && !p.opts.Requantize {
		return gguf.Tensor{}, "", fmt.Errorf("module %s: its %s rows of %d weights end in a partial super-block (K is not a multiple of 256), which ggml's %s cannot hold; --requantize dequantizes it and quantizes again to --type %s", prefix, info.Scheme, info.K, typ, p.linear)
	}
	if ok && !partial {
		if err := checkRows(r, shape, typ); err != nil {
			return gguf.Tensor{}, "", err
		}
		t := gguf.Tensor{Name: r.gguf, Type: typ, Dims: dims(shape), WriteTo: func(w io.Writer) error {
			qt, err := p.c.Unpack(prefix)
			if err != nil {
				return err
			}
			b, err := repack(qt)
			if err != nil {
				return fmt.Errorf("module %s: %w", prefix, err)
			}
			return writeByteRows(w, b, typ.RowBytes(info.K), r.heads)
		}}
		return t, "repacked losslessly (" + info.Scheme.String() + ")", nil
	}
	if !p.opts.Requantize {
		return gguf.Tensor{}, "", fmt.Errorf("module %s: scheme %s maps onto no ggml type losslessly (%s); --requantize dequantizes it and quantizes again to --type %s", prefix, info.Scheme, lossless, p.linear)
	}
	if err := checkRows(r, shape, p.linear); err != nil {
		return gguf.Tensor{}, "", err
	}
	load := func() ([]float32, error) { return p.c.Float32(r.hf) }
	return lazyFloatTensor(r, p.linear, shape, load), "dequantized and requantized (lossy, from " + info.Scheme.String() + ")", nil
}

// repack writes a quantized tensor's codes and scales as ggml blocks, refusing anything that
// would not decode to exactly the same weights.
func repack(t *quant.Tensor) ([]byte, error) {
	_, b, err := ggmltype.Encode(t)
	return b, err
}
