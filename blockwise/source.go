package blockwise

import (
	"encoding/binary"
	"math"

	"github.com/qpack-dev/qpack/fp"
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

// spanned converts like segment and tracks the span as it goes. A BF16 value's float32 bits
// order non-negative values as signed integers and negative ones by magnitude as unsigned
// integers above 0x80000000, so two integer maxima give the span: hi = the largest signed bits
// (at least those of +0), lo = minus the magnitude of the largest unsigned bits (at least those
// of −0). A NaN or infinity lands beyond every finite value in one of them, as in minMax.
func (s bf16Rows) spanned(n, lo, hi int, buf []float32) ([]float32, span) {
	raw := s.raw[2*(n*s.k+lo) : 2*(n*s.k+hi)]
	buf = buf[:hi-lo]
	var pos0, pos1 int32 = 0, 0                    // +0
	var neg0, neg1 uint32 = 0x80000000, 0x80000000 // −0
	i := 0
	if hasAVX2 && len(buf) >= 8 { // eight at a time, the same two maxima
		i = len(buf) &^ 7
		pos0, neg0 = bf16SpanAVX2(&buf[0], &raw[0], i)
	}
	for ; i+4 <= len(buf); i += 4 {
		x := binary.LittleEndian.Uint64(raw[2*i:])
		u0, u1 := uint32(x<<16), uint32(x)&0xffff0000
		u2, u3 := uint32(x>>16)&0xffff0000, uint32(x>>32)&0xffff0000
		b := buf[i : i+4 : i+4]
		b[0], b[1] = math.Float32frombits(u0), math.Float32frombits(u1)
		b[2], b[3] = math.Float32frombits(u2), math.Float32frombits(u3)
		pos0, pos1 = max(pos0, int32(u0), int32(u2)), max(pos1, int32(u1), int32(u3))
		neg0, neg1 = max(neg0, u0, u2), max(neg1, u1, u3)
	}
	r := span{
		lo: 0 - math.Float32frombits(max(neg0, neg1)&0x7fffffff), // 0 − (+0) is +0, as minMax gives
		hi: math.Float32frombits(uint32(max(pos0, pos1))),
	}
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
	buf = buf[:hi-lo]
	fp.DecodeBF16(buf, s.raw[2*(n*s.k+lo):2*(n*s.k+hi)])
	return buf
}
