// Package ggmltype maps the ggml tensor types a GGUF file holds onto the quant schemes qpack
// fits them with, and writes fitted tensors as ggml's blocks.
//
// Each ggml type qpack quantizes to is one Rung: the k-quants are qpack's k-quant schemes
// (ggml's block fields, fitted by package kquant), the lattice (IQ) types qpack's IQ schemes
// (ggml's block fields, fitted by package iquant), Q8_0, Q5_0 and Q4_0 are symmetric integer
// grids with groups of 32 and F16 scales (x = d·(q − z), which is what those blocks store).
// Adding a type is one entry in rungs.
package ggmltype

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// Rung is one ggml type and the scheme qpack fits it with.
type Rung struct {
	Type   gguf.Type
	Scheme quant.Scheme
}

func kq(bits int) quant.Scheme {
	s, err := quant.KQuantScheme(bits)
	if err != nil {
		panic(err) // bits are the constants below
	}
	return s
}

func iq(t quant.IQType) quant.Scheme {
	s, err := quant.IQuantScheme(t)
	if err != nil {
		panic(err) // t is one of the constants below
	}
	return s
}

func sym32(bits int) quant.Scheme { return quant.Scheme{Bits: bits, GroupSize: 32, Sym: true} }

// rungs are the ggml types qpack writes, fewest bits per weight first (ties: the finer grid).
var rungs = []Rung{
	{gguf.IQ1_S, iq(quant.IQ1S)},     // 1.5625 bpw
	{gguf.IQ1_M, iq(quant.IQ1M)},     // 1.75
	{gguf.IQ2_XXS, iq(quant.IQ2XXS)}, // 2.0625
	{gguf.IQ2_XS, iq(quant.IQ2XS)},   // 2.3125
	{gguf.IQ2_S, iq(quant.IQ2S)},     // 2.5625
	{gguf.Q2_K, kq(2)},               // 2.625
	{gguf.IQ3_XXS, iq(quant.IQ3XXS)}, // 3.0625
	{gguf.IQ3_S, iq(quant.IQ3S)},     // 3.4375
	{gguf.Q3_K, kq(3)},               // 3.4375
	{gguf.IQ4_XS, iq(quant.IQ4XS)},   // 4.25
	{gguf.IQ4_NL, iq(quant.IQ4NL)},   // 4.5
	{gguf.Q4_0, sym32(4)},            // 4.5
	{gguf.Q4_K, kq(4)},               // 4.5
	{gguf.Q5_0, sym32(5)},            // 5.5
	{gguf.Q5_K, kq(5)},               // 5.5
	{gguf.Q6_K, kq(6)},               // 6.5625
	{gguf.Q8_0, sym32(8)},            // 8.5
}

// Rungs returns the ggml types qpack quantizes to, fewest bits per weight first.
func Rungs() []Rung { return slices.Clone(rungs) }

// TypeOf returns the ggml type a scheme's tensors are written as.
func TypeOf(s quant.Scheme) (gguf.Type, bool) {
	for _, r := range rungs {
		if r.Scheme == s {
			return r.Type, true
		}
	}
	return 0, false
}

// SchemeOf returns the scheme qpack fits ggml type t with.
func SchemeOf(t gguf.Type) (quant.Scheme, bool) {
	for _, r := range rungs {
		if r.Type == t {
			return r.Scheme, true
		}
	}
	return quant.Scheme{}, false
}

// Names lists the rungs' ggml type names, for messages.
func Names() string {
	var s []string
	for _, r := range rungs {
		s = append(s, r.Type.String())
	}
	return strings.Join(s, ", ")
}

// Supports says whether scheme s is one of the rungs, naming them when it is not.
func Supports(s quant.Scheme) error {
	if _, ok := TypeOf(s); ok {
		return nil
	}
	return fmt.Errorf("GGUF holds ggml types; %s is none of them (the schemes of %s: %s)", s, Names(), schemeNames())
}

func schemeNames() string {
	var s []string
	for _, r := range rungs {
		s = append(s, r.Scheme.String())
	}
	return strings.Join(s, ", ")
}

// Fits says whether rows of k weights are whole blocks of type t.
func Fits(t gguf.Type, k int) error {
	if bs := t.BlockSize(); bs == 0 || k%bs != 0 {
		return fmt.Errorf("rows of %d weights are not whole %s blocks of %d", k, t, bs)
	}
	return nil
}

// Bytes is the size of an n×k weight in type t (k must be whole blocks).
func Bytes(t gguf.Type, n, k int) int64 { return int64(n) * int64(t.RowBytes(k)) }

// Encode writes a fitted tensor's rows as blocks of its ggml type, in row order: the same
// weights, which ggml's dequantize_row_* gives back bit for bit. It refuses what the blocks
// cannot hold exactly (act-order column groups, scales F16 cannot hold, partial super-blocks).
func Encode(t *quant.Tensor) (gguf.Type, []byte, error) {
	typ, ok := HeldAs(t.Scheme)
	if !ok {
		return 0, nil, Supports(t.Scheme)
	}
	if err := Fits(typ, t.K); err != nil {
		return 0, nil, err
	}
	out := make([]byte, 0, Bytes(typ, t.N, t.K))
	var err error
	switch t.Scheme.Grid {
	case quant.KQuant:
		out, err = encodeKQuant(out, t)
	case quant.IQuant:
		out, err = iquant.AppendRows(out, t)
	case quant.MXFP4:
		out, err = encodeMXFP4(out, t)
	default:
		out, err = encodeInt(out, t, typ)
	}
	return typ, out, err
}

// HeldAs returns the ggml type whose blocks hold a scheme's tensors as they are (Encode): a
// rung's type, or one of the types below that hold some tensors of a scheme qpack fits
// otherwise.
func HeldAs(s quant.Scheme) (gguf.Type, bool) {
	if t, ok := TypeOf(s); ok {
		return t, true
	}
	return repackOnly(s)
}

// repackOnly maps schemes qpack does not fit ggml types with but whose tensors a ggml type can
// hold when their values allow: int4-g32-asym as Q4_1 (when −z·scale is exact in F16), and
// mxfp4 as MXFP4, which only llama.cpp builds from August 2025 on load (so it is no rung).
func repackOnly(s quant.Scheme) (gguf.Type, bool) {
	switch {
	case s == (quant.Scheme{Bits: 4, GroupSize: 32}):
		return gguf.Q4_1, true
	case s.Grid == quant.MXFP4:
		return gguf.MXFP4, true
	}
	return 0, false
}

func encodeKQuant(out []byte, t *quant.Tensor) ([]byte, error) {
	kt, err := kquant.TypeOf(t.Scheme)
	if err != nil {
		return nil, err
	}
	for n := range t.N {
		if out, err = kt.AppendRow(out, t, n); err != nil {
			return nil, fmt.Errorf("row %d: %w", n, err)
		}
	}
	return out, nil
}

// encodeInt writes integer groups of 32 as Q8_0 (qs = q − 128), Q5_0/Q4_0 (the codes, which
// ggml offsets by 16 or 8) or Q4_1 (m = −z·scale).
func encodeInt(out []byte, t *quant.Tensor, typ gguf.Type) ([]byte, error) {
	for k, g := range t.GIdx {
		if int(g) != k/32 {
			return nil, fmt.Errorf("act-order group index (column %d in group %d) has no ggml block equivalent", k, g)
		}
	}
	ng := t.K / 32
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
			case gguf.Q4_1:
				m := -float32(zero) * scale
				if fp.F16ToF32(fp.F32ToF16(m)) != m {
					return nil, fmt.Errorf("row %d group %d: offset −z·scale = %g is not exact in F16, so Q4_1 would change the weights", r, g, m)
				}
				out = binary.LittleEndian.AppendUint16(out, fp.F32ToF16(m))
			default:
				if want := uint8(1) << (t.Scheme.Bits - 1); zero != want {
					return nil, fmt.Errorf("row %d group %d: zero point %d, %s needs %d", r, g, zero, typ, want)
				}
			}
			out = gguf.AppendCodes32(out, typ == gguf.Q5_0, codes)
		}
	}
	return out, nil
}

// fallbacks are llama.cpp's substitutes for a type whose blocks do not divide a tensor's rows
// (llama_tensor_get_type's convert_incompatible_tensor), and the rung qpack writes for each
// while it lacks llama.cpp's: Q5_1 (6 bpw, a grid with an F16 minimum).
var fallbacks = map[gguf.Type]struct{ llama, qpack gguf.Type }{
	gguf.IQ1_S:   {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.IQ1_M:   {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.IQ2_XXS: {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.IQ2_XS:  {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.IQ2_S:   {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.IQ3_XXS: {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.IQ3_S:   {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.IQ4_XS:  {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.Q2_K:    {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.Q3_K:    {gguf.IQ4_NL, gguf.IQ4_NL},
	gguf.Q4_K:    {gguf.Q5_0, gguf.Q5_0},
	gguf.Q5_K:    {gguf.Q5_1, gguf.Q5_0},
	gguf.Q6_K:    {gguf.Q8_0, gguf.Q8_0},
}

// Fallback returns the type qpack writes for rows of k weights planned as t: t itself when
// its blocks divide the rows, else llama.cpp's substitute (or, while qpack cannot write that,
// the rung of the same or nearest size, said in why); ok is false when no quantized type fits
// and the tensor must stay a float (llama.cpp then writes F16).
func Fallback(t gguf.Type, k int) (sub gguf.Type, why string, ok bool) {
	if Fits(t, k) == nil {
		return t, "", true
	}
	fb, known := fallbacks[t]
	if !known || Fits(fb.qpack, k) != nil {
		return 0, fmt.Sprintf("rows of %d weights fit no %s block: kept as a float, as llama.cpp does", k, t), false
	}
	why = fmt.Sprintf("rows of %d weights are not whole %s blocks: %s, llama.cpp's fallback", k, t, fb.llama)
	if fb.qpack != fb.llama {
		why = fmt.Sprintf("rows of %d weights are not whole %s blocks: %s in place of llama.cpp's fallback %s, which qpack does not write yet", k, t, fb.qpack, fb.llama)
	}
	return fb.qpack, why, true
}

// encodeMXFP4 writes an MXFP4 tensor as ggml's block_mxfp4 (ggml-common.h): per block of 32,
// the E8M0 byte e of its scale 2^(e−127), then qs[j] = code j | code j+16 << 4. ggml's E2M1
// codes are qpack's (sign in bit 3; kvalues_mxfp4 holds the values doubled, and ggml halves
// the scale, GGML_E8M0_TO_FP32_HALF), so the blocks decode to the same weights.
func encodeMXFP4(out []byte, t *quant.Tensor) ([]byte, error) {
	const qk = 32
	blocks := t.K / qk
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
