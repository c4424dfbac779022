package blockwise

import (
	"encoding/binary"
	"math"
)

// rowSource yields float32 weights W[n, lo:hi], either a view of the input or converted into
// buf (len ≥ hi − lo, owned by the calling goroutine).
type rowSource interface {
	segment(n, lo, hi int, buf []float32) []float32
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
