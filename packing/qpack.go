package packing

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/quant"
)

// QPack is qpack's own layout. It holds a quant.Tensor of any scheme, so a checkpoint may mix
// schemes freely. All tensors are little-endian, row-major safetensors tensors.
//
// Scheme. The safetensors __metadata__ entry "qpack.scheme.<P>" (P the module prefix, e.g.
// "model.layers.0.mlp.up_proj") holds the scheme name as quant.Scheme.String writes it:
//
//	int<b>-g<G>-sym|asym   integer grid, b ∈ 2…8:  w = scale·(q − z)
//	int<b>-pc-sym|asym     the same with one group per output row
//	nf4-g<G> / nf4-pc      w = scale·NF4[q] (the bitsandbytes NF4 table, formats.md §4.2)
//	fp8                    q is an FP8 E4M3FN byte: w = scale·e4m3(q), one scale per row
//	bin-g<G>-sym|asym      1-bit: w = offset + scale·(2q − 1), offset 0 when symmetric
//
// For W[N, K] with G the group size (G = K for "pc"), ng = ⌈K/G⌉ groups (1 for fp8) and
// b the code width (1 for bin, 4 for nf4, 8 for fp8), module P stores:
//
//	P.qpack_shape   I64 [2]             [N, K]
//	P.qpack_codes   U8  [N, ⌈K·b/8⌉]    each row's K codes as a little-endian bitstream: code k
//	                                    occupies bits k·b … k·b+b−1 of the row, bit j of the
//	                                    row being bit j mod 8 of byte j/8 (a 3-bit code may
//	                                    straddle two bytes); unused high bits are zero.
//	P.qpack_scales  F16 [N, ng]         scale of row n, group g (fp8: F32 [N, 1])
//	P.qpack_zeros   U8  [N, ⌈ng·b/8⌉]   integer asymmetric only: each row's ng zero points
//	                                    z ∈ [0, 2^b) as a bitstream like the codes. Symmetric
//	                                    integer schemes store none: z = 2^(b−1).
//	P.qpack_offsets F16 [N, ng]         binary asymmetric only
//	P.qpack_g_idx   I32 [K]             act-order only: the group of each input column;
//	                                    without it column k is in group k / G.
//
// The checkpoint's config.json carries {"quant_method": "qpack", "version": 1, …} (see
// QuantizationConfig); the per-tensor metadata above is all a reader needs.
type QPack struct{}

func (QPack) Name() string { return "qpack" }

func (QPack) Supports(s quant.Scheme) error { return s.Validate() }

func (QPack) Metadata(prefix string, t *quant.Tensor) map[string]string {
	return map[string]string{SchemeKey + "." + prefix: t.Scheme.String()}
}

func (f QPack) Pack(prefix string, t *quant.Tensor) ([]Raw, error) {
	if err := checkTensor(prefix, t); err != nil {
		return nil, err
	}
	s, n, k := t.Scheme, t.N, t.K
	ng := paramGroups(s, k)
	kb := PackedLen[uint8](k, s.Bits)
	codes := make([]byte, n*kb)
	for r := range n {
		if err := PackStream(codes[r*kb:], 1, t.Codes[r*k:], 1, k, s.Bits); err != nil {
			return nil, fmt.Errorf("tensor %s, output row %d: %w", prefix, r, err)
		}
	}
	out := []Raw{
		shapeRaw(prefix+".qpack_shape", n, k),
		{Name: prefix + ".qpack_codes", DType: "U8", Shape: []int{n, kb}, Data: codes},
	}
	if s.Grid == quant.FP8E4M3 {
		sc, err := f32Raw(prefix+".qpack_scales", t.Scales, n, 1)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	} else {
		sc, err := f16Raw(prefix+".qpack_scales", t.Scales, identity, n, ng)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	if s.Grid == quant.Integer && !s.Sym {
		zb := PackedLen[uint8](ng, s.Bits)
		zeros := make([]byte, n*zb)
		for r := range n {
			if err := PackStream(zeros[r*zb:], 1, t.Zeros[r*ng:], 1, ng, s.Bits); err != nil {
				return nil, fmt.Errorf("tensor %s zeros: %w", prefix, err)
			}
		}
		out = append(out, Raw{Name: prefix + ".qpack_zeros", DType: "U8", Shape: []int{n, zb}, Data: zeros})
	}
	if s.Grid == quant.Binary && !s.Sym {
		off, err := f16Raw(prefix+".qpack_offsets", t.Offsets, identity, n, ng)
		if err != nil {
			return nil, err
		}
		out = append(out, off)
	}
	if t.GIdx != nil {
		out = append(out, int32sRaw(prefix+".qpack_g_idx", t.GIdx))
	}
	return out, nil
}

func (f QPack) Unpack(prefix string, get func(string) (Raw, bool), meta map[string]string) (*quant.Tensor, error) {
	s, err := schemeFor(prefix, meta)
	if err != nil {
		return nil, err
	}
	g := getter(get)
	shape, err := g.need(prefix + ".qpack_shape")
	if err != nil {
		return nil, err
	}
	n, k, err := rawShape(shape)
	if err != nil {
		return nil, err
	}
	ng := paramGroups(s, k)
	cr, err := g.need(prefix + ".qpack_codes")
	if err != nil {
		return nil, err
	}
	kb := PackedLen[uint8](k, s.Bits)
	if err := cr.expect("U8", n, kb); err != nil { // before allocating what the shape claims
		return nil, err
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k), Scales: make([]float32, n*ng)}
	for r := range n {
		if err := UnpackStream(t.Codes[r*k:], 1, cr.Data[r*kb:], 1, k, s.Bits); err != nil {
			return nil, err
		}
	}

	sc, err := g.need(prefix + ".qpack_scales")
	if err != nil {
		return nil, err
	}
	if s.Grid == quant.FP8E4M3 {
		if err := sc.expect("F32", n, 1); err != nil {
			return nil, err
		}
		for i := range t.Scales {
			t.Scales[i] = math.Float32frombits(binary.LittleEndian.Uint32(sc.Data[4*i:]))
		}
	} else {
		if err := sc.expect("F16", n, ng); err != nil {
			return nil, err
		}
		rawF16(sc, t.Scales, identity)
	}

	switch {
	case s.Grid == quant.Integer && s.Sym:
		t.Zeros = make([]uint8, n*ng)
		for i := range t.Zeros {
			t.Zeros[i] = uint8(symZero(s))
		}
	case s.Grid == quant.Integer:
		zr, err := g.need(prefix + ".qpack_zeros")
		if err != nil {
			return nil, err
		}
		zb := PackedLen[uint8](ng, s.Bits)
		if err := zr.expect("U8", n, zb); err != nil {
			return nil, err
		}
		t.Zeros = make([]uint8, n*ng)
		for r := range n {
			if err := UnpackStream(t.Zeros[r*ng:], 1, zr.Data[r*zb:], 1, ng, s.Bits); err != nil {
				return nil, err
			}
		}
	case s.Grid == quant.Binary && !s.Sym:
		or, err := g.need(prefix + ".qpack_offsets")
		if err != nil {
			return nil, err
		}
		if err := or.expect("F16", n, ng); err != nil {
			return nil, err
		}
		t.Offsets = make([]float32, n*ng)
		rawF16(or, t.Offsets, identity)
	}

	if gr, ok := get(prefix + ".qpack_g_idx"); ok {
		gr.Name = prefix + ".qpack_g_idx"
		if err := gr.expect("I32", k); err != nil {
			return nil, err
		}
		t.GIdx = rawInt32s(gr)
		if err := checkGIdx(gr.Name, t.GIdx, k, ng); err != nil {
			return nil, err
		}
	}
	return checkUnpacked(prefix, t)
}

func (QPack) Bytes(s quant.Scheme, n, k int) int64 {
	ng := int64(paramGroups(s, k))
	n64 := int64(n)
	b := 16 + n64*int64(PackedLen[uint8](k, s.Bits))
	switch {
	case s.Grid == quant.FP8E4M3:
		b += n64 * 4
	default:
		b += n64 * ng * 2
	}
	if s.Grid == quant.Integer && !s.Sym {
		b += n64 * int64(PackedLen[uint8](int(ng), s.Bits))
	}
	if s.Grid == quant.Binary && !s.Sym {
		b += n64 * ng * 2
	}
	return b
}

func (QPack) TensorNames(prefix string) []string {
	return []string{prefix + ".qpack_shape", prefix + ".qpack_codes", prefix + ".qpack_scales",
		prefix + ".qpack_zeros", prefix + ".qpack_offsets", prefix + ".qpack_g_idx"}
}
