// Package quanttest makes random valid quantized tensors for tests of several packages.
package quanttest

import (
	"math/bits"
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

// RandomIQuant returns a valid n×k tensor of IQ scheme s (k a multiple of its block) with
// random fields over their whole ranges: d of either sign, every sub-block scale, grid point,
// sign byte (with even parity where the format stores 7 of 8 signs) and code.
func RandomIQuant(r *rand.Rand, s quant.Scheme, n, k int) *quant.Tensor {
	f, _ := s.IQuant()
	t := quant.NewIQuantTensor(s, n, k)
	for i := range t.Scales {
		t.Scales[i] = quant.RoundF16(float32(r.NormFloat64() * 0.01))
	}
	for i := range t.SubScales {
		t.SubScales[i] = int8(f.ScaleLo + r.IntN(f.ScaleHi-f.ScaleLo+1))
	}
	for i := range t.Codes {
		t.Codes[i] = uint8(r.IntN(16))
	}
	for i := range t.Points {
		t.Points[i] = uint16(r.IntN(f.GridSize))
	}
	for i := range t.Signs {
		switch {
		case f.Bits == 1:
			t.Signs[i] = uint8(r.IntN(2))
		case f.Parity:
			v := uint8(r.IntN(128))
			t.Signs[i] = v | uint8(bits.OnesCount8(v)%2)<<7
		default:
			t.Signs[i] = uint8(r.IntN(256))
		}
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
