package iquant

import (
	"encoding/binary"
	"fmt"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// ggml's block structs (ggml-common.h); F16 and wider values are little-endian. sc is a
// sub-block scale as quant.Tensor holds it, p a grid point, s a sign byte (7 bits stored where
// the format keeps parity: bit 7 is then the parity of bits 0–6):
//
//	block_iq4_nl   18 bytes: f16 d, u8 qs[16] (code j low nibble of byte j, code j+16 high)
//	block_iq4_xs  136 bytes: f16 d, u16 scales_h (bits 2i–2i+1: (sc_i+32)>>4), u8 scales_l[4]
//	                         (nibble i: (sc_i+32)&15), u8 qs[128] (16 bytes per 32 as iq4_nl)
//	block_iq3_xxs  98 bytes: f16 d, u8 p[64], then per sub-block of 32 a u32: s₀ | s₁<<7 |
//	                         s₂<<14 | s₃<<21 | sc<<28
//	block_iq3_s   110 bytes: f16 d, u8 p&255 [64], u8 qh[8] (bit i%8 of byte i/8: p_i>>8),
//	                         u8 s[32], u8 scales[4] (nibble i: sc_i)
//	block_iq2_xxs  66 bytes: f16 d, per sub-block of 32 two u32: p₀ | p₁<<8 | p₂<<16 | p₃<<24,
//	                         then s₀ | s₁<<7 | s₂<<14 | s₃<<21 | sc<<28
//	block_iq2_xs   74 bytes: f16 d, u16 qs[32] (p | s<<9), u8 scales[8] (nibble i: sc_i)
//	block_iq2_s    82 bytes: f16 d, u8 p&255 [32], u8 s[32], u8 qh[8] (bits 2(i%4)–2(i%4)+1
//	                         of byte i/4: p_i>>8), u8 scales[8] (nibble i: sc_i)
//	block_iq1_s    50 bytes: f16 d, u8 p&255 [32], per sub-block of 32 a u16: p_k>>8 at bits
//	                         3k–3k+2, sc at bits 12–14, bit 15 set for δ = −1/8
//	block_iq1_m    56 bytes: u8 p&255 [32], per sub-block of 16 a byte: p₀>>8 | δ₀<<3 |
//	                         (p₁>>8)<<4 | δ₁<<7, then four u16: sc_i at bits 3(i%4) of word
//	                         i/4, and d's bits 4j–4j+3 at bits 12–15 of word j

// AppendRows appends the rows of the IQ tensor q to dst as ggml blocks of its type: the same
// weights, bit for bit, under ggml's dequantize_row_iqX.
func AppendRows(dst []byte, q *quant.Tensor) ([]byte, error) {
	t, err := TypeOf(q.Scheme)
	if err != nil {
		return nil, err
	}
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("iquant: %w", err)
	}
	for n := range q.N {
		for b := range q.K / t.Block {
			p := t.Get(q, n, b)
			dst = t.appendBlock(dst, &p)
		}
	}
	return dst, nil
}

// Decode reads ggml blocks of IQ scheme s holding an n×k tensor (k a multiple of the block)
// into a quant.Tensor; AppendRows writes the same bytes back.
func Decode(s quant.Scheme, data []byte, n, k int) (*quant.Tensor, error) {
	t, err := TypeOf(s)
	if err != nil {
		return nil, err
	}
	if n <= 0 || k <= 0 || k%t.Block != 0 {
		return nil, fmt.Errorf("iquant: a %dx%d %s tensor (rows must be whole blocks of %d)", n, k, s, t.Block)
	}
	blocks := n * k / t.Block
	if len(data) != blocks*t.BlockBytes {
		return nil, fmt.Errorf("iquant: %d bytes for a %dx%d %s tensor (want %d)", len(data), n, k, s, blocks*t.BlockBytes)
	}
	q := quant.NewIQuantTensor(s, n, k)
	for i := range blocks {
		p := t.parseBlock(data[i*t.BlockBytes : (i+1)*t.BlockBytes])
		t.Put(q, i/(k/t.Block), i%(k/t.Block), &p)
	}
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("iquant: %w", err)
	}
	return q, nil
}

func appendF16(dst []byte, v float32) []byte {
	return binary.LittleEndian.AppendUint16(dst, fp.F32ToF16(v))
}

func f16At(b []byte) float32 { return fp.F16ToF32(binary.LittleEndian.Uint16(b)) }

// parity7 is sign byte s as stored in 7 bits; withParity restores bit 7.
func withParity(s7 uint8) uint8 {
	s7 &= 127
	p := s7 ^ s7>>4
	p ^= p >> 2
	p ^= p >> 1
	return s7 | (p&1)<<7
}

func (t *Type) appendBlock(dst []byte, p *Params) []byte {
	if t.Type != quant.IQ1M {
		dst = appendF16(dst, p.D)
	}
	switch t.Type {
	case quant.IQ4NL:
		return appendNibbles(dst, p.Codes[:32])
	case quant.IQ4XS:
		var h uint16
		var l [4]uint8
		for i, sc := range p.Scales[:8] {
			v := uint8(sc + 32)
			h |= uint16(v>>4) << (2 * i)
			l[i/2] |= (v & 15) << (4 * (i % 2))
		}
		dst = binary.LittleEndian.AppendUint16(dst, h)
		dst = append(dst, l[:]...)
		for i := range 8 {
			dst = appendNibbles(dst, p.Codes[32*i:32*i+32])
		}
		return dst
	case quant.IQ3XXS:
		for _, pt := range p.Points[:64] {
			dst = append(dst, uint8(pt))
		}
		for ib := range 8 {
			dst = binary.LittleEndian.AppendUint32(dst, signWord(p.Signs[4*ib:4*ib+4])|uint32(p.Scales[ib])<<28)
		}
		return dst
	case quant.IQ3S:
		dst = appendLowBytes(dst, p.Points[:64])
		dst = appendHighBits(dst, p.Points[:64], 1)
		dst = append(dst, p.Signs[:32]...)
		return appendScaleNibbles(dst, p.Scales[:8])
	case quant.IQ2XXS:
		for ib := range 8 {
			pts := p.Points[4*ib : 4*ib+4]
			dst = binary.LittleEndian.AppendUint32(dst, uint32(pts[0])|uint32(pts[1])<<8|uint32(pts[2])<<16|uint32(pts[3])<<24)
			dst = binary.LittleEndian.AppendUint32(dst, signWord(p.Signs[4*ib:4*ib+4])|uint32(p.Scales[ib])<<28)
		}
		return dst
	case quant.IQ2XS:
		for i, pt := range p.Points[:32] {
			dst = binary.LittleEndian.AppendUint16(dst, pt|uint16(p.Signs[i]&127)<<9)
		}
		return appendScaleNibbles(dst, p.Scales[:16])
	case quant.IQ2S:
		dst = appendLowBytes(dst, p.Points[:32])
		dst = append(dst, p.Signs[:32]...)
		dst = appendHighBits(dst, p.Points[:32], 2)
		return appendScaleNibbles(dst, p.Scales[:16])
	case quant.IQ1S:
		dst = appendLowBytes(dst, p.Points[:32])
		for ib := range 8 {
			h := uint16(p.Scales[ib])<<12 | uint16(p.Signs[ib])<<15
			for k, pt := range p.Points[4*ib : 4*ib+4] {
				h |= pt >> 8 << (3 * k)
			}
			dst = binary.LittleEndian.AppendUint16(dst, h)
		}
		return dst
	default: // iq1_m
		dst = appendLowBytes(dst, p.Points[:32])
		for ib := range 16 {
			dst = append(dst, uint8(p.Points[2*ib]>>8|p.Points[2*ib+1]>>8<<4)|p.Signs[2*ib]<<3|p.Signs[2*ib+1]<<7)
		}
		d := fp.F32ToF16(p.D)
		for w := range 4 {
			v := d >> (4 * w) & 15 << 12
			for i, sc := range p.Scales[4*w : 4*w+4] {
				v |= uint16(sc) << (3 * i)
			}
			dst = binary.LittleEndian.AppendUint16(dst, v)
		}
		return dst
	}
}

func (t *Type) parseBlock(b []byte) Params {
	var p Params
	if t.Type != quant.IQ1M {
		p.D, b = f16At(b), b[2:]
	}
	switch t.Type {
	case quant.IQ4NL:
		parseNibbles(p.Codes[:32], b)
	case quant.IQ4XS:
		h, l := binary.LittleEndian.Uint16(b), b[2:6]
		for i := range 8 {
			p.Scales[i] = int8(l[i/2]>>(4*(i%2))&15|uint8(h>>(2*i)&3)<<4) - 32
		}
		for i := range 8 {
			parseNibbles(p.Codes[32*i:32*i+32], b[6+16*i:])
		}
	case quant.IQ3XXS:
		for i := range 64 {
			p.Points[i] = uint16(b[i])
		}
		for ib := range 8 {
			w := binary.LittleEndian.Uint32(b[64+4*ib:])
			p.Scales[ib] = int8(w >> 28)
			parseSignWord(p.Signs[4*ib:4*ib+4], w)
		}
	case quant.IQ3S:
		parseLowBytes(p.Points[:64], b)
		parseHighBits(p.Points[:64], b[64:], 1)
		copy(p.Signs[:32], b[72:104])
		parseScaleNibbles(p.Scales[:8], b[104:])
	case quant.IQ2XXS:
		for ib := range 8 {
			pts, w := binary.LittleEndian.Uint32(b[8*ib:]), binary.LittleEndian.Uint32(b[8*ib+4:])
			for k := range 4 {
				p.Points[4*ib+k] = uint16(uint8(pts >> (8 * k)))
			}
			p.Scales[ib] = int8(w >> 28)
			parseSignWord(p.Signs[4*ib:4*ib+4], w)
		}
	case quant.IQ2XS:
		for i := range 32 {
			v := binary.LittleEndian.Uint16(b[2*i:])
			p.Points[i], p.Signs[i] = v&511, withParity(uint8(v>>9))
		}
		parseScaleNibbles(p.Scales[:16], b[64:])
	case quant.IQ2S:
		parseLowBytes(p.Points[:32], b)
		copy(p.Signs[:32], b[32:64])
		parseHighBits(p.Points[:32], b[64:], 2)
		parseScaleNibbles(p.Scales[:16], b[72:])
	case quant.IQ1S:
		parseLowBytes(p.Points[:32], b)
		for ib := range 8 {
			h := binary.LittleEndian.Uint16(b[32+2*ib:])
			for k := range 4 {
				p.Points[4*ib+k] |= h >> (3 * k) & 7 << 8
			}
			p.Scales[ib], p.Signs[ib] = int8(h>>12&7), uint8(h>>15)
		}
	default: // iq1_m
		parseLowBytes(p.Points[:32], b)
		for ib := range 16 {
			h := b[32+ib]
			p.Points[2*ib] |= uint16(h&7) << 8
			p.Points[2*ib+1] |= uint16(h>>4&7) << 8
			p.Signs[2*ib], p.Signs[2*ib+1] = h>>3&1, h>>7
		}
		var d uint16
		for w := range 4 {
			v := binary.LittleEndian.Uint16(b[48+2*w:])
			d |= v >> 12 << (4 * w)
			for i := range 4 {
				p.Scales[4*w+i] = int8(v >> (3 * i) & 7)
			}
		}
		p.D = fp.F16ToF32(d)
	}
	return p
}

// signWord packs four sign bytes in 7 bits each.
func signWord(s []uint8) uint32 {
	var w uint32
	for k, v := range s {
		w |= uint32(v&127) << (7 * k)
	}
	return w
}

func parseSignWord(s []uint8, w uint32) {
	for k := range s {
		s[k] = withParity(uint8(w >> (7 * k)))
	}
}

// appendNibbles stores 32 4-bit codes: code j in the low nibble of byte j, code j+16 high.
func appendNibbles(dst []byte, c []uint8) []byte {
	for j := range 16 {
		dst = append(dst, c[j]|c[j+16]<<4)
	}
	return dst
}

func parseNibbles(c []uint8, b []byte) {
	for j := range 16 {
		c[j], c[j+16] = b[j]&15, b[j]>>4
	}
}

func appendLowBytes(dst []byte, pts []uint16) []byte {
	for _, pt := range pts {
		dst = append(dst, uint8(pt))
	}
	return dst
}

func parseLowBytes(pts []uint16, b []byte) {
	for i := range pts {
		pts[i] = uint16(b[i])
	}
}

// appendHighBits stores the bits above the low byte of each point, width bits per point,
// point i at bit width·i of the little-endian bitstream.
func appendHighBits(dst []byte, pts []uint16, width int) []byte {
	out := make([]byte, len(pts)*width/8)
	for i, pt := range pts {
		out[i*width/8] |= uint8(pt>>8) << (i * width % 8)
	}
	return append(dst, out...)
}

func parseHighBits(pts []uint16, b []byte, width int) {
	for i := range pts {
		pts[i] |= uint16(b[i*width/8]>>(i*width%8)&(1<<width-1)) << 8
	}
}

// appendScaleNibbles stores 4-bit sub-block scales, scale i in nibble i%2 of byte i/2.
func appendScaleNibbles(dst []byte, sc []int8) []byte {
	for i := 0; i < len(sc); i += 2 {
		dst = append(dst, uint8(sc[i])|uint8(sc[i+1])<<4)
	}
	return dst
}

func parseScaleNibbles(sc []int8, b []byte) {
	for i := range sc {
		sc[i] = int8(b[i/2] >> (4 * (i % 2)) & 15)
	}
}
