// Package quanttest makes random valid quantized tensors for tests of several packages.
package quanttest

import (
	"math/rand/v2"

	"github.com/qpack-dev/qpack/fp"
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

// RandomMicroscaled returns a valid n×k tensor of scheme s (NVFP4, MXFP4 or FP8Block) with
// random codes and scales over their whole ranges: every E2M1 code, E4M3 block scales from the
// smallest subnormal to 448, E8M0 scales from 2^−127 to 2^127, every FP8 byte but the NaNs,
// and FP8 block scales shared by the rows of a block.
func RandomMicroscaled(r *rand.Rand, s quant.Scheme, n, k int) *quant.Tensor {
	groups := s.Groups(k)
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k), Scales: make([]float32, n*groups)}
	for i := range t.Codes {
		t.Codes[i] = uint8(r.IntN(1 << s.Bits))
		for s.Grid == quant.FP8Block && t.Codes[i]&0x7f == 0x7f {
			t.Codes[i] = uint8(r.IntN(256))
		}
	}
	for i := range t.Scales {
		switch s.Grid {
		case quant.NVFP4:
			t.Scales[i] = fp.E4M3ToF32(uint8(1 + r.IntN(0x7e)))
		case quant.MXFP4:
			t.Scales[i] = quant.E8M0Value(uint8(r.IntN(255)))
		default:
			if row := i / groups; row%s.GroupSize == 0 {
				t.Scales[i] = float32(r.ExpFloat64() * 1e-3)
			} else {
				t.Scales[i] = t.Scales[i-groups] // the block's first row's
			}
		}
	}
	if s.Grid == quant.NVFP4 {
		t.GlobalScale = float32(r.ExpFloat64() * 1e4)
	}
	return t
}
