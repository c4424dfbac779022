package kquant

import (
	"encoding/binary"
	"fmt"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// ggml's block structs (ggml-common.h), 256 weights each; F16 values are little-endian:
//
//	block_q2_K  84 bytes: u8 scales[16] (scale | min<<4), u8 qs[64], f16 d, f16 dmin
//	block_q3_K 110 bytes: u8 hmask[32], u8 qs[64], u8 scales[12] (6-bit, +32), f16 d
//	block_q4_K 144 bytes: f16 d, f16 dmin, u8 scales[12] (6-bit scales and mins), u8 qs[128]
//	block_q5_K 176 bytes: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]
//	block_q6_K 210 bytes: u8 ql[128], u8 qh[64], i8 scales[16], f16 d
//
// The 2-bit fields of q2_k and q3_k: byte l of each 128-weight half holds weights l, l+32,
// l+64 and l+96 of the half in bits 0–1, 2–3, 4–5 and 6–7. q3_k's hmask bit j/32 of byte j%32
// is set when code j ≥ 4 (its value q − 4 then has no −4). The nibbles of q4_k and q5_k: byte
// l of each 64-weight chunk holds weight l (low) and l+32 (high); q5_k's fifth bits go to
// qh[l], bit 2c (low) or 2c+1 (high) for chunk c. q6_k: per 128-weight half, low nibbles in
// 64 bytes (weights l and l+64 in byte l, l+32 and l+96 in byte l+32) and the top two bits of
// weights l, l+32, l+64, l+96 in byte l of 32.

// BlockBytes is the size of one ggml block of the type (ggml's type_size).
func (t *Type) BlockBytes() int { return blockBytes[t.Bits] }

var blockBytes = [7]int{2: 84, 3: 110, 4: 144, 5: 176, 6: 210}

// AppendRow appends row n of the k-quant tensor q (its K a multiple of 256) to dst as ggml
// blocks of q's type: the same weights, bit for bit, under ggml's dequantize_row_qX_K.
func (t *Type) AppendRow(dst []byte, q *quant.Tensor, n int) ([]byte, error) {
	if q.Scheme != t.Scheme {
		return nil, fmt.Errorf("kquant: a %s tensor encoded as %s", q.Scheme, t.Scheme)
	}
	if q.K%quant.SuperBlock != 0 {
		return nil, fmt.Errorf("K = %d is not a multiple of 256: ggml's %s blocks hold whole super-blocks", q.K, t.Scheme)
	}
	for b := range q.K / quant.SuperBlock {
		p := t.Get(q, n, b)
		codes := q.Codes[n*q.K+b*quant.SuperBlock:]
		dst = t.appendBlock(dst, &p, (*[quant.SuperBlock]uint8)(codes))
	}
	return dst, nil
}

func (t *Type) appendBlock(dst []byte, p *Params, L *[quant.SuperBlock]uint8) []byte {
	switch t.Bits {
	case 2:
		for j := range 16 {
			dst = append(dst, uint8(p.Scales[j])|p.Mins[j]<<4)
		}
		dst = appendCrumbs(dst, L)
		return appendF16(appendF16(dst, p.D), p.DMin)
	case 3:
		dst = appendHighBits(dst, L)
		dst = appendCrumbs(dst, L)
		dst = appendScales6(dst, t, p)
		return appendF16(dst, p.D)
	case 4, 5:
		dst = appendF16(appendF16(dst, p.D), p.DMin)
		dst = appendScaleMinK4(dst, p)
		if t.Bits == 5 {
			dst = appendFifthBits(dst, L)
		}
		return appendNibbles(dst, L)
	default:
		dst = appendQ6Codes(dst, L)
		for _, sc := range p.Scales {
			dst = append(dst, uint8(sc))
		}
		return appendF16(dst, p.D)
	}
}

func appendF16(dst []byte, v float32) []byte {
	return binary.LittleEndian.AppendUint16(dst, fp.F32ToF16(v))
}

// appendCrumbs stores the low two bits of each code: byte l of half h holds codes 128h + l +
// 32i in bits 2i, 2i+1.
func appendCrumbs(dst []byte, L *[quant.SuperBlock]uint8) []byte {
	for h := 0; h < quant.SuperBlock; h += 128 {
		for l := range 32 {
			dst = append(dst, L[h+l]&3|(L[h+l+32]&3)<<2|(L[h+l+64]&3)<<4|(L[h+l+96]&3)<<6)
		}
	}
	return dst
}

// appendHighBits is q3_k's hmask: bit j/32 of byte j%32 is code j's bit 2.
func appendHighBits(dst []byte, L *[quant.SuperBlock]uint8) []byte {
	var hmask [32]uint8
	for j, q := range L {
		hmask[j%32] |= (q >> 2 & 1) << (j / 32)
	}
	return append(dst, hmask[:]...)
}

// appendScales6 is q3_k's 12 scale bytes: the low nibbles of the stored (+32) scales 0–7 in
// bytes 0–7 and of 8–15 in their high nibbles; the top two bits of scale j in byte 8 + j%4 at
// bit 2·(j/4).
func appendScales6(dst []byte, t *Type, p *Params) []byte {
	var s [12]uint8
	for j, sc := range p.Scales {
		v := t.StoredScale(sc)
		s[j%8] |= (v & 15) << (4 * (j / 8))
		s[8+j%4] |= (v >> 4) << (2 * (j / 4))
	}
	return append(dst, s[:]...)
}

// appendScaleMinK4 packs eight 6-bit scales and mins into 12 bytes (ggml's get_scale_min_k4
// reads them): j < 4 in bytes j (scale) and j+4 (min), low six bits; j ≥ 4 as nibbles of byte
// j+4 (scale low, min high) with their top two bits in bits 6–7 of bytes j−4 (scale) and j (min).
func appendScaleMinK4(dst []byte, p *Params) []byte {
	var s [12]uint8
	for j := range 8 {
		sc, m := uint8(p.Scales[j]), p.Mins[j]
		if j < 4 {
			s[j] |= sc
			s[j+4] |= m
			continue
		}
		s[j+4] = sc&15 | (m&15)<<4
		s[j-4] |= sc >> 4 << 6
		s[j] |= m >> 4 << 6
	}
	return append(dst, s[:]...)
}

// appendFifthBits is q5_k's qh: code 64c + l's bit 4 at bit 2c of byte l, code 64c + 32 + l's
// at bit 2c + 1.
func appendFifthBits(dst []byte, L *[quant.SuperBlock]uint8) []byte {
	var qh [32]uint8
	for c := range 4 {
		for l := range 32 {
			qh[l] |= (L[64*c+l]>>4&1)<<(2*c) | (L[64*c+32+l]>>4&1)<<(2*c+1)
		}
	}
	return append(dst, qh[:]...)
}

// appendNibbles stores the low four bits of each code: byte l of chunk c holds code 64c + l
// (low nibble) and 64c + 32 + l (high).
func appendNibbles(dst []byte, L *[quant.SuperBlock]uint8) []byte {
	for c := 0; c < quant.SuperBlock; c += 64 {
		for l := range 32 {
			dst = append(dst, L[c+l]&15|(L[c+l+32]&15)<<4)
		}
	}
	return dst
}

// appendQ6Codes stores q6_k's ql and qh (see the layout above).
func appendQ6Codes(dst []byte, L *[quant.SuperBlock]uint8) []byte {
	var ql [128]uint8
	var qh [64]uint8
	for h := range 2 {
		q := L[128*h:]
		for l := range 32 {
			ql[64*h+l] = q[l]&15 | (q[l+64]&15)<<4
			ql[64*h+l+32] = q[l+32]&15 | (q[l+96]&15)<<4
			qh[32*h+l] = q[l]>>4 | (q[l+32]>>4)<<2 | (q[l+64]>>4)<<4 | (q[l+96]>>4)<<6
		}
	}
	return append(append(dst, ql[:]...), qh[:]...)
}
