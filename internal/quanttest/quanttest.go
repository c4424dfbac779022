// Package quanttest makes random valid quantized tensors for tests of several packages.
package quanttest

import (
	"math/rand/v2"

	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/quant"
)

// RandomKQuant returns a valid n×k tensor of k-quant scheme s with random codes and parameters
// over their whole ranges: d of either sign, dmin ≥ 0, every sub-block scale and min.
func RandomKQuant(r *rand.Rand, s quant.Scheme, n, k int) *quant.Tensor {
	kt, _ := s.KQuant()
	t := quant.NewKQuantTensor(s, n, k)
	for i := range t.Codes {
		t.Codes[i] = uint8(r.IntN(1 << s.Bits))
	}
	for i := range t.Scales {
		t.Scales[i] = quant.RoundF16(float32(r.NormFloat64() * 0.01))
	}
	for i := range t.Mins {
		t.Mins[i] = quant.RoundF16(float32(r.Float64() * 0.01))
	}
	for i := range t.SubScales {
		t.SubScales[i] = int8(kt.ScaleLo + r.IntN(kt.ScaleHi-kt.ScaleLo+1))
	}
	for i := range t.SubMins {
		t.SubMins[i] = uint8(r.IntN(kt.MinHi + 1))
	}
	return t
}

// RandomIQuant returns a valid n×k tensor of IQ scheme s (k a multiple of its block) decoded
// from random ggml blocks: every field over its whole range, d any finite F16 below 2.
func RandomIQuant(r *rand.Rand, s quant.Scheme, n, k int) *quant.Tensor {
	f, _ := s.IQuant()
	data := make([]byte, n*k/f.Block*f.BlockBytes)
	for i := range data {
		data[i] = uint8(r.Uint32())
	}
	for b := 0; b < len(data); b += f.BlockBytes {
		if s.IQ == quant.IQ1M {
			data[b+f.BlockBytes-1] &= 0xbf // d's top nibble is in the last scale word
		} else {
			data[b+1] &= 0xbf
		}
	}
	t, err := iquant.Decode(s, data, n, k)
	if err != nil {
		panic(err)
	}
	return t
}
