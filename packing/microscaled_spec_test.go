package packing

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/internal/quanttest"
	"github.com/qpack-dev/qpack/quant"
)

// Decoders written from the published descriptions, not from the packers or package fp:
//
//   - OCP Microscaling Formats (MX) v1.0, §5.3.3: an FP4 E2M1 element is 1 sign bit, 2 exponent
//     bits (bias 1) and 1 mantissa bit; exponent 0 is subnormal, 2^0 × 0.m; no Inf or NaN.
//     §5.4: the E8M0 shared scale is 2^(e − 127), 0xFF NaN.
//   - OCP 8-bit Floating Point (OFP8), E4M3: bias 7, 3 mantissa bits, S.1111.111 is NaN, no
//     infinities, exponent 0 subnormal: 2^−6 × 0.mmm.
//   - NVIDIA's NVFP4: E2M1 in blocks of 16, an E4M3 scale per block and an FP32 scale per tensor;
//     compressed-tensors stores the latter as a divisor (weight_global_scale) and computes
//     x·(scale/global) (lifecycle/forward.py, _dequantize).
//   - compressed-tensors' pack_fp4_to_uint8: consecutive pairs of a row, the first in the low
//     nibble.
//   - DeepSeek-V3 / transformers FineGrainedFP8: weight F8_E4M3 [N, K] times weight_scale_inv
//     [⌈N/B⌉, ⌈K/B⌉] broadcast over B×B blocks.

func specE2M1(nibble uint8) float64 {
	sign, exp, man := nibble>>3&1, int(nibble>>1&3), float64(nibble&1)
	v := math.Ldexp(man/2, 0) // subnormal: 2^(1−bias) × 0.m, bias 1
	if exp > 0 {
		v = math.Ldexp(1+man/2, exp-1)
	}
	if sign == 1 {
		return -v
	}
	return v
}

func specE4M3(b uint8) float64 {
	sign, exp, man := b>>7, int(b>>3&15), float64(b&7)
	if exp == 15 && man == 7 {
		return math.NaN()
	}
	v := math.Ldexp(man/8, -6)
	if exp > 0 {
		v = math.Ldexp(1+man/8, exp-7)
	}
	if sign == 1 {
		return -v
	}
	return v
}

func specE8M0(e uint8) float64 { return math.Ldexp(1, int(e)-127) }

// specFP4Rows decodes an FP4 weight_packed/qpack_codes tensor [N, K/2] with block scales.
func specFP4Rows(codes, scales []byte, global float32, s quant.Scheme, n, k int) []float32 {
	out := make([]float32, n*k)
	for r := range n {
		for c := range k {
			b := codes[r*k/2+c/2]
			nib := b & 15
			if c%2 == 1 {
				nib = b >> 4
			}
			blk := scales[r*(k/s.GroupSize)+c/s.GroupSize]
			var f float32
			if s.Grid == quant.NVFP4 {
				f = float32(specE4M3(blk)) / global // float32, as torch computes it
			} else {
				f = float32(specE8M0(blk))
			}
			out[r*k+c] = float32(specE2M1(nib)) * f
		}
	}
	return out
}

func f32At(r Raw, i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(r.Data[4*i:]))
}

func TestMicroscaledLayoutsDecodeBySpec(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	const n, k = 19, 96
	for _, c := range []struct {
		format                 string
		s                      quant.Scheme
		codes, scales, global  string
		codesDType, scaleDType string
	}{
		{"compressed-tensors", quant.NVFP4Scheme, "weight_packed", "weight_scale", "weight_global_scale", "U8", "F8_E4M3"},
		{"compressed-tensors", quant.MXFP4Scheme, "weight_packed", "weight_scale", "", "U8", "U8"},
		{"qpack", quant.NVFP4Scheme, "qpack_codes", "qpack_scales", "qpack_global_scale", "U8", "F8_E4M3"},
		{"qpack", quant.MXFP4Scheme, "qpack_codes", "qpack_scales", "", "U8", "U8"},
		{"fp8", quant.FP8BlockScheme(32), "weight", "weight_scale_inv", "", "F8_E4M3", "F32"},
		{"qpack", quant.FP8BlockScheme(32), "qpack_codes", "qpack_scales", "", "U8", "F32"},
	} {
		f, _ := Lookup(c.format)
		x := quanttest.RandomMicroscaled(rng, c.s, n, k)
		raws, err := f.Pack("p", x)
		if err != nil {
			t.Fatal(err)
		}
		m := rawsByName(raws)
		codes, scales := m["p."+c.codes], m["p."+c.scales]
		if codes.DType != c.codesDType || scales.DType != c.scaleDType {
			t.Fatalf("%s %s: dtypes %s, %s, want %s, %s", c.format, c.s, codes.DType, scales.DType, c.codesDType, c.scaleDType)
		}
		var got []float32
		switch {
		case c.s.IsFP4():
			var global float32
			if c.global != "" {
				g := m["p."+c.global]
				if g.DType != "F32" || len(g.Shape) != 1 || g.Shape[0] != 1 {
					t.Fatalf("%s %s: global scale %s %v", c.format, c.s, g.DType, g.Shape)
				}
				global = f32At(g, 0)
			}
			if want := []int{n, k / 2}; codes.Shape[0] != want[0] || codes.Shape[1] != want[1] {
				t.Fatalf("%s %s: codes shape %v, want %v", c.format, c.s, codes.Shape, want)
			}
			got = specFP4Rows(codes.Data, scales.Data, global, c.s, n, k)
		default:
			b := c.s.GroupSize
			got = make([]float32, n*k)
			for r := range n {
				for col := range k {
					got[r*k+col] = float32(specE4M3(codes.Data[r*k+col])) * f32At(scales, r/b*((k+b-1)/b)+col/b)
				}
			}
		}
		want := x.Dequantize(nil)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) && got[i] != want[i] {
				t.Fatalf("%s %s: weight (%d, %d) decodes by the spec to %v, Dequantize says %v", c.format, c.s, i/k, i%k, got[i], want[i])
			}
		}
	}
}

// The spec decoders themselves, on values the descriptions list.
func TestSpecDecoders(t *testing.T) {
	for code, want := range map[uint8]float64{0: 0, 1: 0.5, 2: 1, 3: 1.5, 4: 2, 5: 3, 6: 4, 7: 6, 9: -0.5, 15: -6} {
		if got := specE2M1(code); got != want {
			t.Errorf("E2M1 %#x = %v, want %v", code, got, want)
		}
	}
	for b, want := range map[uint8]float64{0x7e: 448, 0x38: 1, 0x01: math.Ldexp(1, -9), 0x08: math.Ldexp(1, -6), 0xb8: -1} {
		if got := specE4M3(b); got != want {
			t.Errorf("E4M3 %#x = %v, want %v", b, got, want)
		}
	}
	if specE8M0(127) != 1 || specE8M0(0) != math.Ldexp(1, -127) || specE8M0(254) != math.Ldexp(1, 127) {
		t.Error("E8M0 decode wrong")
	}
}
