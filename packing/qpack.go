package packing

import (
	"encoding/binary"
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
//	nf4-g<G> / nf4-pc      w = scale·NF4[q] (the bitsandbytes NF4 table, docs/reference/formats.md §4.2)
//	fp8                    q is an FP8 E4M3FN byte: w = scale·e4m3(q), one scale per row
//	bin-g<G>-sym|asym      1-bit: w = offset + scale·(2q − 1), offset 0 when symmetric
//	q2_k … q6_k            llama.cpp's k-quants (quant/kquant.go): per super-block of 256
//	                       weights an F16 d (and dmin), per sub-block of G an integer scale sc
//	                       (and min m): w = (d·sc)·q − dmin·m, or (d·sc)·(q − o), o = 4 (q3_k), 32 (q6_k)
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
// K-quant modules (G = 16 for q2_k, q3_k, q6_k and 32 for q4_k, q5_k; K a multiple of G;
// ns = ⌈K/256⌉ super-blocks, the last of a row shorter when 256 does not divide K; nb = K/G
// sub-blocks; s the sub-block scale width: 4 bits for q2_k, 8 for q6_k, else 6) store
// P.qpack_shape and P.qpack_codes as above (b = 2 … 6, q unsigned), then
//
//	P.qpack_scales    F16 [N, ns]           d of each super-block (any sign; 0 allowed)
//	P.qpack_subscales U8  [N, ⌈nb·s/8⌉]     each row's nb sub-block scales as an s-bit bitstream
//	                                        like the codes: q2_k 0…15, q3_k sc + 32 (sc ∈ −32…31),
//	                                        q4_k and q5_k 0…63, q6_k the int8's two's complement
//	P.qpack_mins      F16 [N, ns]           dmin of each super-block (q2_k, q4_k, q5_k only)
//	P.qpack_submins   U8  [N, ⌈nb·s/8⌉]     the sub-block mins likewise: q2_k 0…15, q4_k, q5_k 0…63
//
// With whole super-blocks that is ggml's size: 2.625 (q2_k), 3.4375 (q3_k), 4.5 (q4_k), 5.5
// (q5_k) and 6.5625 (q6_k) bits per weight, and ggufexport repacks the values into ggml blocks
// losslessly.
//
// IQ modules (iq1_s … iq4_xs, llama.cpp's IQ formats, quant/iquant.go; K a multiple of the
// block: 256, 32 for iq4_nl) store P.qpack_shape and the weights as ggml's blocks themselves:
//
//	P.qpack_blocks    U8  [N, K/block·bytes]   each row's blocks (block_iqX of ggml-common.h)
//
// which is ggml's size: 1.5625 (iq1_s), 1.75 (iq1_m), 2.0625 (iq2_xxs), 2.3125 (iq2_xs), 2.5625
// (iq2_s), 3.0625 (iq3_xxs), 3.4375 (iq3_s), 4.25 (iq4_xs) and 4.5 (iq4_nl) bits per weight.
//
// The microscaled schemes nvfp4, mxfp4 and fp8-b<B> (quant/microscaled.go) store P.qpack_shape
// and the bytes of microscaled.go, which compressed-tensors and the FP8 releases store too:
//
//	P.qpack_codes        U8 [N, K/2]        nvfp4, mxfp4: two E2M1 codes a byte, even column low
//	                     U8 [N, K]          fp8-b<B>: E4M3 bytes
//	P.qpack_scales       F8_E4M3 [N, K/16]  nvfp4: E4M3 block scales
//	                     U8 [N, K/32]       mxfp4: E8M0 block scales (2^(e−127))
//	                     F32 [⌈N/B⌉, ⌈K/B⌉] fp8-b<B>: one scale per B×B block
//	P.qpack_global_scale F32 [1]            nvfp4: the global scale G (w = e2m1·(s/G))
//
// That is 4.5 bits per weight and 32 bits per tensor (nvfp4), 4.25 (mxfp4), 8 + 32/B² (fp8-b<B>).
//
// The checkpoint's config.json carries {"quant_method": "qpack", "version": 1, …} (see
// QuantizationConfig); the per-tensor metadata above is all a reader needs.
type QPack struct{}

func (QPack) MixedSchemes() bool { return true }

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
	if s.Grid == quant.IQuant {
		return f.packIQuant(prefix, t)
	}
	if s.Grid.IsMicroscaled() {
		raws, err := packMicroscaled(t, qpackMicroNames(prefix))
		return append([]Raw{shapeRaw(prefix+".qpack_shape", n, k)}, raws...), err
	}
	ng := paramGroups(s, k)
	codes, err := packRows(prefix+".qpack_codes", t.Codes, n, k, s.Bits)
	if err != nil {
		return nil, err
	}
	out := []Raw{shapeRaw(prefix+".qpack_shape", n, k), codes}
	if s.Grid == quant.KQuant {
		return f.packKQuant(out, prefix, t)
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
		zeros, err := packRows(prefix+".qpack_zeros", t.Zeros, n, ng, s.Bits)
		if err != nil {
			return nil, err
		}
		out = append(out, zeros)
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
	if s.Grid == quant.KQuant {
		return f.unpackKQuant(g, prefix, s, n, k)
	}
	if s.Grid == quant.IQuant {
		return f.unpackIQuant(g, prefix, s, n, k)
	}
	if s.Grid.IsMicroscaled() {
		t, err := unpackMicroscaled(g, qpackMicroNames(prefix), s, n, k)
		if err != nil {
			return nil, err
		}
		return checkUnpacked(prefix, t)
	}
	ng := paramGroups(s, k)
	codes, err := unpackRows(g, prefix+".qpack_codes", n, k, s.Bits) // checked before allocating what the shape claims
	if err != nil {
		return nil, err
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: codes, Scales: make([]float32, n*ng)}

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
		if t.Zeros, err = unpackRows(g, prefix+".qpack_zeros", n, ng, s.Bits); err != nil {
			return nil, err
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
	if s.Grid == quant.IQuant {
		return iquantBytes(s, n, k)
	}
	if s.Grid.IsMicroscaled() {
		return 16 + microscaledBytes(s, n, k)
	}
	ng := int64(paramGroups(s, k))
	n64 := int64(n)
	b := 16 + n64*int64(PackedLen[uint8](k, s.Bits))
	if s.Grid == quant.KQuant {
		return b + kquantParamBytes(s, n, k)
	}
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
		prefix + ".qpack_zeros", prefix + ".qpack_offsets", prefix + ".qpack_g_idx",
		prefix + ".qpack_mins", prefix + ".qpack_subscales", prefix + ".qpack_submins", prefix + ".qpack_blocks", prefix + ".qpack_global_scale"}
}

// qpackMicroNames are qpack's names for the microscaled tensors (microscaled.go).
func qpackMicroNames(prefix string) microNames {
	return microNames{codes: prefix + ".qpack_codes", scales: prefix + ".qpack_scales",
		global: prefix + ".qpack_global_scale", codesDType: "U8"}
}
