package blockwise

import (
	"encoding/binary"
	"math"
)

// rowSource yields float32 weights W[n, lo:hi], either a view of the input or converted into
// buf (len ≥ hi − lo, owned by the calling goroutine). spanned also returns their span
// (minMax), computed during the conversion where that saves a pass.
type rowSource interface {
	segment(n, lo, hi int, buf []float32) []float32
	spanned(n, lo, hi int, buf []float32) ([]float32, span)
}

func (s float32Rows) spanned(n, lo, hi int, buf []float32) ([]float32, span) {
	w := s.segment(n, lo, hi, buf)
	return w, minMax(w)
}

// spanned converts like segment and tracks the order keys of the values as it goes.
func (s bf16Rows) spanned(n, lo, hi int, buf []float32) ([]float32, span) {
	raw := s.raw[2*(n*s.k+lo) : 2*(n*s.k+hi)]
	buf = buf[:hi-lo]
	var lo0, hi0, lo1, hi1 int32 // key(0) = 0 puts 0 in the range
	i := 0
	for ; i+4 <= len(buf); i += 4 {
		x := binary.LittleEndian.Uint64(raw[2*i:])
		u0, u1 := uint32(x<<16), uint32(x)&0xffff0000
		u2, u3 := uint32(x>>16)&0xffff0000, uint32(x>>32)&0xffff0000
		b := buf[i : i+4 : i+4]
		b[0], b[1] = math.Float32frombits(u0), math.Float32frombits(u1)
		b[2], b[3] = math.Float32frombits(u2), math.Float32frombits(u3)
		k0, k1, k2, k3 := bitsKey(u0), bitsKey(u1), bitsKey(u2), bitsKey(u3)
		lo0, hi0 = min(lo0, k0, k2), max(hi0, k0, k2)
		lo1, hi1 = min(lo1, k1, k3), max(hi1, k1, k3)
	}
	r := span{fromOrderKey(min(lo0, lo1)), fromOrderKey(max(hi0, hi1))}
	if i < len(buf) {
		tail := s.segment(n, lo+i, hi, buf[i:])
		t := minMax(tail)
		r = span{min(r.lo, t.lo), max(r.hi, t.hi)}
	}
	return buf, r
}

type float32Rows struct {
	w []float32
	k int
}

func (s float32Rows) segment(n, lo, hi int, _ []float32) []float32 {
	return s.w[n*s.k+lo : n*s.k+hi]
}

// bf16Rows converts little-endian BF16 rows: a BF16 value is the top half of a float32.
type bf16Rows struct {
	raw []byte
	k   int
}

func (s bf16Rows) segment(n, lo, hi int, buf []float32) []float32 {
	raw := s.raw[2*(n*s.k+lo) : 2*(n*s.k+hi)]
	buf = buf[:hi-lo]
	i := 0
	for ; i+4 <= len(buf); i += 4 { // four values per 8-byte load
		x := binary.LittleEndian.Uint64(raw[2*i:])
		b := buf[i : i+4 : i+4]
		b[0] = math.Float32frombits(uint32(x << 16))
		b[1] = math.Float32frombits(uint32(x) & 0xffff0000)
		b[2] = math.Float32frombits(uint32(x>>16) & 0xffff0000)
		b[3] = math.Float32frombits(uint32(x>>32) & 0xffff0000)
	}
	for ; i < len(buf); i++ {
		buf[i] = math.Float32frombits(uint32(raw[2*i])<<16 | uint32(raw[2*i+1])<<24)
	}
	return buf
}
