package ggufexport

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/quant"
)

// lossless names the integer schemes whose codes and scales are ggml blocks as they are:
// x = scale·(q − z) with F16 scales, one group of 32 along K.
//
//	int8-g32-sym  → Q8_0: d = scale, qs = q − 128
//	int4-g32-sym  → Q4_0: d = scale, nibble = q (ggml subtracts 8, qpack's z)
//	int4-g32-asym → Q4_1: d = scale, m = −z·scale, when every m is exact in F16
//
// the k-quants q2_k … q6_k → Q2_K … Q6_K: the same d, dmin, sub-block scales, mins and
// codes in ggml's block layout (kquant.Type.AppendRow), when K is a multiple of 256; and
// mxfp4 → MXFP4: each block's E8M0 byte and E2M1 codes (repackMXFP4).
const lossless = "int8-g32-sym → Q8_0, int4-g32-sym → Q4_0, int4-g32-asym → Q4_1 (when −z·scale is exact in F16), q2_k … q6_k → Q2_K … Q6_K, mxfp4 → MXFP4"

func repackType(s quant.Scheme) (gguf.Type, bool) {
	if s.Grid == quant.KQuant {
		return kquantTypes[s.Bits], true
	}
	if s.Grid == quant.MXFP4 {
		return gguf.MXFP4, true
	}
	if s.Grid != quant.Integer || s.GroupSize != 32 {
		return 0, false
	}
	switch {
	case s.Bits == 8 && s.Sym:
		return gguf.Q8_0, true
	case s.Bits == 4 && s.Sym:
		return gguf.Q4_0, true
	case s.Bits == 4:
		return gguf.Q4_1, true
	}
	return 0, false
}

func (p *planner) module(r role, prefix string) (gguf.Tensor, string, error) {
	info, err := p.c.Module(prefix)
	if err != nil {
		return gguf.Tensor{}, "", err
	}
	shape := []int{info.N, info.K}
	typ, ok := repackType(info.Scheme)
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
			b, err := repack(qt, typ)
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
// would not decode to exactly the same weights (act-order column groups, a scale or offset
// that F16 cannot hold).
func repack(t *quant.Tensor, typ gguf.Type) ([]byte, error) {
	if t.Scheme.Grid == quant.KQuant {
		return repackKQuant(t)
	}
	if t.Scheme.Grid == quant.MXFP4 {
		return repackMXFP4(t)
	}
	for k, g := range t.GIdx {
		if int(g) != k/32 {
			return nil, fmt.Errorf("act-order group index (column %d in group %d) has no ggml block equivalent", k, g)
		}
	}
	ng := t.K / 32
	out := make([]byte, 0, t.N*typ.RowBytes(t.K))
	for r := range t.N {
		for g := range ng {
			i := r*ng + g
			scale, zero := t.Scales[i], t.Zeros[i]
			d := fp.F32ToF16(scale)
			if fp.F16ToF32(d) != scale {
				return nil, fmt.Errorf("row %d group %d: scale %g is not exact in F16", r, g, scale)
			}
			out = binary.LittleEndian.AppendUint16(out, d)
			codes := t.Codes[r*t.K+32*g : r*t.K+32*g+32]
			switch typ {
			case gguf.Q8_0:
				for _, q := range codes {
					out = append(out, byte(int8(int(q)-int(zero))))
				}
				continue
			case gguf.Q4_0:
				if zero != 8 {
					return nil, fmt.Errorf("row %d group %d: zero point %d, Q4_0 needs 8", r, g, zero)
				}
			case gguf.Q4_1:
				m := -float32(zero) * scale
				if fp.F16ToF32(fp.F32ToF16(m)) != m {
					return nil, fmt.Errorf("row %d group %d: offset −z·scale = %g is not exact in F16, so Q4_1 would change the weights (--requantize)", r, g, m)
				}
				out = binary.LittleEndian.AppendUint16(out, fp.F32ToF16(m))
			}
			for j := range 16 {
				out = append(out, codes[j]&15|codes[j+16]<<4)
			}
		}
	}
	return out, nil
}

// repackMXFP4 writes an MXFP4 tensor as ggml's block_mxfp4 (ggml-common.h): per block of 32,
// the E8M0 byte e of its scale 2^(e−127), then qs[j] = code j | code j+16 << 4. ggml's E2M1
// codes are qpack's (sign in bit 3; kvalues_mxfp4 holds the values doubled, and ggml halves
// the scale, GGML_E8M0_TO_FP32_HALF), so the blocks decode to the same weights.
func repackMXFP4(t *quant.Tensor) ([]byte, error) {
	const qk = 32
	blocks := t.K / qk
	out := make([]byte, 0, t.N*blocks*(1+qk/2))
	for i, scale := range t.Scales {
		e, ok := quant.E8M0Byte(scale)
		if !ok {
			return nil, fmt.Errorf("row %d block %d: scale %g is not an E8M0 power of two", i/blocks, i%blocks, scale)
		}
		out = append(out, e)
		codes := t.Codes[i*qk : (i+1)*qk] // block i of the row-major tensor
		for j := range qk / 2 {
			out = append(out, codes[j]&15|codes[j+16]<<4)
		}
	}
	return out, nil
}
