// Package quanttest makes random valid quantized tensors for tests of several packages.
package quanttest

import (
	"math/rand/v2"

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
