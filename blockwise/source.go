package blockwise

import "math"

// rowSource yields one float32 row of W, either a view of the input or converted into buf
// (len k, owned by the calling goroutine).
type rowSource interface {
	row(n int, buf []float32) []float32
}

type float32Rows struct {
	w []float32
	k int
}

func (s float32Rows) row(n int, _ []float32) []float32 { return s.w[n*s.k : (n+1)*s.k] }

// bf16Rows converts little-endian BF16 rows: a BF16 value is the top half of a float32.
type bf16Rows struct {
	raw []byte
	k   int
}

func (s bf16Rows) row(n int, buf []float32) []float32 {
	raw := s.raw[2*n*s.k : 2*(n+1)*s.k]
	buf = buf[:len(raw)/2]
	for i := range buf {
		b := raw[2*i : 2*i+2 : 2*i+2] // one bounds check per value instead of two
		buf[i] = math.Float32frombits(uint32(b[0])<<16 | uint32(b[1])<<24)
	}
	return buf
}
