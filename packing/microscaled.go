package packing

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// The microscaled grids (quant/microscaled.go) store the same bytes in every layout that holds
// them; only the tensor names differ. For W[N, K]:
//
//	FP4 codes    U8 [N, K/2]: row-major, two E2M1 codes a byte, column 2j in the low nibble
//	             and 2j+1 in the high one (a 4-bit PackStream), sign in each nibble's bit 3
//	NVFP4 scales F8_E4M3 [N, K/16]: the E4M3 byte of each block scale
//	NVFP4 global F32 [1]: the global scale G, a divisor (w = e2m1·(s/G))
//	MXFP4 scales U8 [N, K/32]: the E8M0 byte e of each block scale 2^(e−127)
//	FP8 codes    U8 or F8_E4M3 [N, K]: the E4M3 byte of each weight
//	FP8 scales   F32 [⌈N/B⌉, ⌈K/B⌉]: each B×B block's scale (a multiplier)
//
// which are compressed-tensors' nvfp4-pack-quantized and mxfp4-pack-quantized tensors
// (weight_packed, weight_scale, weight_global_scale) and the FP8 releases' weight and
// weight_scale_inv (docs/fp4.md has the sources).

// microNames are the stored names of one module's microscaled tensors in a layout.
type microNames struct {
	codes, scales, global string
	codesDType            string // FP8 blocks: "U8" (qpack) or "F8_E4M3"
}

// packMicroscaled stores t (NVFP4, MXFP4 or FP8Block) under the names of nm.
func packMicroscaled(t *quant.Tensor, nm microNames) ([]Raw, error) {
	if t.Scheme.Grid == quant.FP8Block {
		return packFP8Block(t, nm)
	}
	codes, err := packRows(nm.codes, t.Codes, t.N, t.K, 4)
	if err != nil {
		return nil, err
	}
	groups := t.K / t.Scheme.GroupSize
	sc := Raw{Name: nm.scales, DType: "U8", Shape: []int{t.N, groups}, Data: make([]byte, len(t.Scales))}
	for i, v := range t.Scales {
		var ok bool
		if t.Scheme.Grid == quant.NVFP4 {
			sc.DType = "F8_E4M3"
			sc.Data[i], ok = quant.E4M3Byte(v)
		} else {
			sc.Data[i], ok = quant.E8M0Byte(v)
		}
		if !ok {
			return nil, fmt.Errorf("tensor %s: block scale %g at row %d, block %d is not an exact %s scale", nm.scales, v, i/groups, i%groups, t.Scheme)
		}
	}
	out := []Raw{codes, sc}
	if t.Scheme.Grid == quant.NVFP4 {
		g, err := f32Raw(nm.global, []float32{t.GlobalScale}, 1)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// packFP8Block stores block FP8 codes as they are and one scale per B×B block, checking that
// the rows of each block agree on it.
func packFP8Block(t *quant.Tensor, nm microNames) ([]Raw, error) {
	b, groups := t.Scheme.GroupSize, t.Scheme.Groups(t.K)
	bands := (t.N + b - 1) / b
	scales := make([]float32, bands*groups)
	for band := range bands {
		copy(scales[band*groups:(band+1)*groups], t.Scales[band*b*groups:])
	}
	sc, err := f32Raw(nm.scales, scales, bands, groups)
	if err != nil {
		return nil, err
	}
	codes := Raw{Name: nm.codes, DType: nm.codesDType, Shape: []int{t.N, t.K}, Data: append([]byte(nil), t.Codes...)}
	return []Raw{codes, sc}, nil // t was validated: its rows share their block's scales
}

// unpackMicroscaled reads an n×k tensor of scheme s stored under the names of nm, checking
// every tensor's dtype and shape before it allocates and the values with Validate.
func unpackMicroscaled(g getter, nm microNames, s quant.Scheme, n, k int) (*quant.Tensor, error) {
	if err := s.CheckRowLength(k); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", nm.codes, err)
	}
	if s.Grid == quant.FP8Block {
		return unpackFP8Block(g, nm, s, n, k)
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k}
	var err error
	if t.Codes, err = unpackRows(g, nm.codes, n, k, 4); err != nil {
		return nil, err
	}
	sc, err := g.need(nm.scales)
	if err != nil {
		return nil, err
	}
	dtype, decode := "U8", quant.E8M0Value
	if s.Grid == quant.NVFP4 {
		dtype, decode = "F8_E4M3", fp.E4M3ToF32
	}
	if err := sc.expect(dtype, n, k/s.GroupSize); err != nil {
		return nil, err
	}
	t.Scales = make([]float32, len(sc.Data))
	for i, b := range sc.Data {
		t.Scales[i] = decode(b)
	}
	if s.Grid == quant.NVFP4 {
		gr, err := g.need(nm.global)
		if err != nil {
			return nil, err
		}
		if err := gr.expect("F32", 1); err != nil {
			return nil, err
		}
		t.GlobalScale = math.Float32frombits(binary.LittleEndian.Uint32(gr.Data))
	}
	return t, nil
}

func unpackFP8Block(g getter, nm microNames, s quant.Scheme, n, k int) (*quant.Tensor, error) {
	codes, err := g.need(nm.codes)
	if err != nil {
		return nil, err
	}
	if err := codes.expect(nm.codesDType, n, k); err != nil {
		return nil, err
	}
	b, groups := s.GroupSize, s.Groups(k)
	bands := (n + b - 1) / b
	sc, err := g.need(nm.scales)
	if err != nil {
		return nil, err
	}
	if err := sc.expect("F32", bands, groups); err != nil {
		return nil, fmt.Errorf("%w (one scale per %d×%d block of the %dx%d weight)", err, b, b, n, k)
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: append([]uint8(nil), codes.Data...), Scales: make([]float32, n*groups)}
	for row := range n {
		for c := range groups {
			t.Scales[row*groups+c] = math.Float32frombits(binary.LittleEndian.Uint32(sc.Data[4*(row/b*groups+c):]))
		}
	}
	return t, nil
}

// microscaledBytes is what packMicroscaled stores for an n×k weight of scheme s.
func microscaledBytes(s quant.Scheme, n, k int) int64 {
	n64, k64 := int64(n), int64(k)
	if s.Grid == quant.FP8Block {
		b := int64(s.GroupSize)
		return n64*k64 + 4*((n64+b-1)/b)*((k64+b-1)/b)
	}
	bytes := n64*int64(PackedLen[uint8](k, 4)) + n64*k64/int64(s.GroupSize)
	if s.Grid == quant.NVFP4 {
		bytes += 4
	}
	return bytes
}
