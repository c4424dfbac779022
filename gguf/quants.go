package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/qpack-dev/qpack/fp"
)

// This file holds ggml's reference quantizers (quantize_row_*_ref in ggml-quants.c) and
// dequantizers (dequantize_row_*) for the types qpack writes from float weights. Float32
// arithmetic is kept as in C (explicit float32 conversions stop Go from fusing a multiply
// and an add), so the bytes equal ggml's.

// Encoders lists the types Encode can produce from float32 weights.
var Encoders = []Type{F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1}

// Encode appends the encoding of x (one or more whole rows) in type t to dst.
func Encode(dst []byte, t Type, x []float32) ([]byte, error) {
	bs := t.BlockSize()
	if bs == 0 {
		return nil, fmt.Errorf("unknown ggml type %d", uint32(t))
	}
	if len(x)%bs != 0 {
		return nil, fmt.Errorf("%d values are not whole %s blocks of %d", len(x), t, bs)
	}
	if i := fp.FirstNonFinite(x); i >= 0 {
		return nil, fmt.Errorf("value %d is %v", i, x[i])
	}
	n := len(dst)
	dst = slices.Grow(dst, t.RowBytes(len(x)))
	switch t {
	case F32:
		dst = dst[:n+4*len(x)]
		for i, v := range x {
			binary.LittleEndian.PutUint32(dst[n+4*i:], math.Float32bits(v))
		}
	case F16:
		dst = dst[:n+2*len(x)]
		for i, v := range x {
			binary.LittleEndian.PutUint16(dst[n+2*i:], fp.F32ToF16(v))
		}
	case BF16:
		dst = dst[:n+2*len(x)]
		for i, v := range x {
			binary.LittleEndian.PutUint16(dst[n+2*i:], fp.F32ToBF16(v))
		}
	case Q8_0:
		for b := 0; b < len(x); b += bs {
			dst = encodeQ8_0(dst, x[b:b+bs])
		}
	case Q4_0, Q5_0:
		if t == Q4_0 && hasAVX2 {
			dst = encodeQ4_0(dst, x)
			break
		}
		for b := 0; b < len(x); b += bs {
			dst = encodeSym(dst, t, x[b:b+bs])
		}
	case Q4_1, Q5_1:
		for b := 0; b < len(x); b += bs {
			dst = encodeMin(dst, t, x[b:b+bs])
		}
	default:
		return nil, fmt.Errorf("qpack cannot quantize to %s from float weights", t)
	}
	return dst, nil
}

func appendF16(dst []byte, v float32) []byte {
	return binary.LittleEndian.AppendUint16(dst, fp.F32ToF16(v))
}

func inverse(d float32) float32 {
	if d == 0 {
		return 0
	}
	return 1 / d
}

// encodeQ8_0 is quantize_row_q8_0_ref: d = amax/127, q = roundf(x/d).
func encodeQ8_0(dst []byte, x []float32) []byte {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	id := inverse(d)
	dst = appendF16(dst, d)
	for _, v := range x {
		dst = append(dst, byte(int8(math.Round(float64(float32(v*id))))))
	}
	return dst
}

// encodeSym is quantize_row_q4_0_ref and quantize_row_q5_0_ref: d = max/−2^(b−1) with max
// the value of largest magnitude (sign kept), q = min(2^b−1, trunc(x/d + 2^(b−1) + 0.5)).
// Element j and j+16 share byte j (low, high nibble); Q5_0's fifth bits go to qh, bit j.
func encodeSym(dst []byte, t Type, x []float32) []byte {
	var amax, mx float32
	for _, v := range x {
		if abs32(v) > amax {
			amax, mx = abs32(v), v
		}
	}
	half := float32(8)
	if t == Q5_0 {
		half = 16
	}
	d := mx / -half
	id := inverse(d)
	dst = appendF16(dst, d)
	var q [32]uint8
	for j, v := range x {
		q[j] = uint8(min(2*half-1, float32(int8(float32(v*id)+(half+0.5)))))
	}
	return AppendCodes32(dst, t == Q5_0, q[:])
}

// encodeQ4_0 is encodeSym for Q4_0 on whole blocks through the AVX2 kernel: the same bytes
// (TestEncodeQ4_0MatchesReference). dst has room for the blocks.
func encodeQ4_0(dst []byte, x []float32) []byte {
	blocks, n := len(x)/32, len(dst)
	dst = dst[:n+18*blocks]
	var d [256]float32
	for b0 := 0; b0 < blocks; b0 += len(d) {
		nb := min(len(d), blocks-b0)
		out := dst[n+18*b0 : n+18*(b0+nb)]
		_ = x[32*(b0+nb)-1]
		q4_0AVX2(&out[2], &d[0], &x[32*b0], nb)
		for b, v := range d[:nb] {
			binary.LittleEndian.PutUint16(out[18*b:], fp.F32ToF16(v))
		}
	}
	return dst
}

// encodeMin is quantize_row_q4_1_ref and quantize_row_q5_1_ref: d = (max−min)/(2^b−1),
// m = min, q = min(2^b−1, trunc((x−min)/d + 0.5)).
func encodeMin(dst []byte, t Type, x []float32) []byte {
	lo, hi := float32(math.MaxFloat32), float32(-math.MaxFloat32)
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	top := float32(15)
	if t == Q5_1 {
		top = 31
	}
	d := (hi - lo) / top
	id := inverse(d)
	dst = appendF16(dst, d)
	dst = appendF16(dst, lo)
	var q [32]uint8
	for j, v := range x {
		q[j] = uint8(min(top, float32(int8(float32((v-lo)*id)+0.5))))
	}
	return AppendCodes32(dst, t == Q5_1, q[:])
}

// AppendCodes32 stores the 32 codes of a Q4_0/Q4_1/Q5_0/Q5_1 block as ggml does: (Q5 only)
// qh with bit j = code j's bit 4, then 16 bytes whose low nibble is code j and high nibble
// code j+16.
func AppendCodes32(dst []byte, five bool, q []uint8) []byte {
	if five {
		var qh uint32
		for j, c := range q {
			qh |= uint32(c>>4&1) << j
		}
		dst = binary.LittleEndian.AppendUint32(dst, qh)
	}
	for j := range 16 {
		dst = append(dst, q[j]&15|(q[j+16]&15)<<4)
	}
	return dst
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// Decode appends the float32 values of data (whole blocks of type t) to dst.
func Decode(dst []float32, t Type, data []byte) ([]float32, error) {
	bs, ts := t.BlockSize(), t.TypeSize()
	if bs == 0 {
		return nil, fmt.Errorf("unknown ggml type %d", uint32(t))
	}
	if len(data)%ts != 0 {
		return nil, fmt.Errorf("%d bytes are not whole %s blocks of %d bytes", len(data), t, ts)
	}
	f16 := func(b []byte) float32 { return fp.F16ToF32(binary.LittleEndian.Uint16(b)) }
	for b := 0; b < len(data); b += ts {
		blk := data[b : b+ts]
		switch t {
		case F32:
			dst = append(dst, math.Float32frombits(binary.LittleEndian.Uint32(blk)))
		case F16:
			dst = append(dst, f16(blk))
		case BF16:
			dst = append(dst, fp.BF16ToF32(binary.LittleEndian.Uint16(blk)))
		case Q8_0:
			d := f16(blk)
			for _, q := range blk[2:] {
				dst = append(dst, float32(int8(q))*d)
			}
		case Q4_0, Q4_1, Q5_0, Q5_1:
			dst = decodeSmall(dst, t, blk, f16)
		case Q2_K:
			dst = decodeQ2K(dst, blk, f16)
		case Q3_K:
			dst = decodeQ3K(dst, blk, f16)
		case Q4_K, Q5_K:
			dst = decodeQ45K(dst, t == Q5_K, blk, f16)
		case Q6_K:
			dst = decodeQ6K(dst, blk, f16)
		case MXFP4:
			dst = decodeMXFP4(dst, blk)
		default:
			return nil, fmt.Errorf("qpack cannot decode %s", t)
		}
	}
	return dst, nil
}

// decodeSmall is dequantize_row_q4_0/q4_1/q5_0/q5_1 for one block.
func decodeSmall(dst []float32, t Type, blk []byte, f16 func([]byte) float32) []float32 {
	d := f16(blk)
	var m, offset float32
	qs := blk[2:]
	if t == Q4_1 || t == Q5_1 {
		m, qs = f16(blk[2:]), blk[4:]
	}
	var qh uint32
	if t == Q5_0 || t == Q5_1 {
		qh, qs = binary.LittleEndian.Uint32(qs), qs[4:]
	}
	switch t {
	case Q4_0:
		offset = 8
	case Q5_0:
		offset = 16
	}
	var out [32]float32
	for j := range 16 {
		lo := uint32(qs[j]&15) | (qh>>j&1)<<4
		hi := uint32(qs[j]>>4) | (qh>>(j+16)&1)<<4
		out[j] = float32((float32(lo)-offset)*d) + m
		out[j+16] = float32((float32(hi)-offset)*d) + m
	}
	return append(dst, out[:]...)
}

// decodeQ2K is dequantize_row_q2_K for one block (u8 scales[16]; u8 qs[64]; f16 d, dmin):
// 16 sub-blocks of 16, scale byte = 4-bit scale | 4-bit min << 4; 2-bit codes, four per
// byte, in two 128-element halves of 32 bytes, shift 0, 2, 4, 6 taking the next 32 elements.
func decodeQ2K(dst []float32, blk []byte, f16 func([]byte) float32) []float32 {
	sc, qs := blk[:16], blk[16:80]
	d, dmin := f16(blk[80:]), f16(blk[82:])
	is := 0
	for n := range 2 {
		q := qs[32*n : 32*n+32]
		for shift := 0; shift < 8; shift += 2 {
			for half := range 2 {
				dl, ml := d*float32(sc[is]&15), dmin*float32(sc[is]>>4)
				is++
				for _, b := range q[16*half : 16*half+16] {
					dst = append(dst, float32(dl*float32(b>>shift&3))-ml)
				}
			}
		}
	}
	return dst
}

// decodeQ3K is dequantize_row_q3_K for one block (u8 hmask[32]; u8 qs[64]; u8 scales[12];
// f16 d): 16 sub-blocks of 16 with 6-bit signed scales (low 4 bits in scales[0..7], high 2
// bits in scales[8..11]); a code is 2 low bits from qs, minus 4 unless its hmask bit is set.
func decodeQ3K(dst []float32, blk []byte, f16 func([]byte) float32) []float32 {
	hmask, qs, sc := blk[:32], blk[32:96], blk[96:108]
	d := f16(blk[108:])
	scale := func(j int) float32 {
		lo := sc[j%8] & 15
		if j >= 8 {
			lo = sc[j-8] >> 4
		}
		hi := sc[8+j%4] >> (2 * (j / 4)) & 3
		return float32(int(lo|hi<<4) - 32)
	}
	is, m := 0, byte(1)
	for n := range 2 {
		q := qs[32*n : 32*n+32]
		for shift := 0; shift < 8; shift += 2 {
			for half := range 2 {
				dl := d * scale(is)
				is++
				for l := 16 * half; l < 16*half+16; l++ {
					v := int(q[l] >> shift & 3)
					if hmask[l]&m == 0 {
						v -= 4
					}
					dst = append(dst, dl*float32(v))
				}
			}
			m <<= 1
		}
	}
	return dst
}

// decodeQ45K is dequantize_row_q4_K and dequantize_row_q5_K for one block (f16 d, dmin;
// u8 scales[12]; Q5_K: u8 qh[32]; u8 qs[128]): 8 sub-blocks of 32 with 6-bit scales and
// mins (get_scale_min_k4); qs in 64-element chunks, low nibbles first; Q5_K's fifth bit of
// chunk c is bit 2c (low nibbles) or 2c+1 (high) of qh[l].
func decodeQ45K(dst []float32, five bool, blk []byte, f16 func([]byte) float32) []float32 {
	d, dmin := f16(blk), f16(blk[2:])
	sc, qh, qs := blk[4:16], blk[16:48], blk[16:]
	if five {
		qs = blk[48:]
	}
	scaleMin := func(j int) (float32, float32) {
		if j < 4 {
			return float32(sc[j] & 63), float32(sc[j+4] & 63)
		}
		return float32(sc[j+4]&15 | sc[j-4]>>6<<4), float32(sc[j+4]>>4 | sc[j]>>6<<4)
	}
	for c := range 4 {
		q := qs[32*c : 32*c+32]
		for nib := range 2 {
			s, m := scaleMin(2*c + nib)
			d1, m1 := d*s, dmin*m
			for l, b := range q {
				v := b >> (4 * nib) & 15
				if five && qh[l]>>(2*c+nib)&1 == 1 {
					v += 16
				}
				dst = append(dst, float32(d1*float32(v))-m1)
			}
		}
	}
	return dst
}

// decodeQ6K is dequantize_row_q6_K for one block (u8 ql[128]; u8 qh[64]; i8 scales[16];
// f16 d): per 128-element half, element l + 32k takes the low or high nibble of ql and 2
// bits of qh[l], minus 32, times d·scale of its 16-element sub-block.
func decodeQ6K(dst []float32, blk []byte, f16 func([]byte) float32) []float32 {
	d := f16(blk[208:])
	var out [256]float32
	for n := range 2 {
		ql, qh, sc := blk[64*n:64*n+64], blk[128+32*n:128+32*n+32], blk[192+8*n:192+8*n+8]
		for l := range 32 {
			is := l / 16
			q := [4]int{
				int(ql[l]&15|(qh[l]>>0&3)<<4) - 32,
				int(ql[l+32]&15|(qh[l]>>2&3)<<4) - 32,
				int(ql[l]>>4|(qh[l]>>4&3)<<4) - 32,
				int(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32,
			}
			for k := range 4 {
				out[128*n+l+32*k] = d * float32(int8(sc[is+2*k])) * float32(q[k])
			}
		}
	}
	return append(dst, out[:]...)
}
