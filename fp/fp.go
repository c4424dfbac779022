// Package fp converts between float32 and the narrow float formats stored in checkpoints:
// IEEE half (F16), bfloat16 (BF16), the OCP FP8 formats E4M3 (FN: no infinities, one NaN) and
// E5M2, and the power-of-two scale format E8M0. Every narrowing conversion rounds to nearest,
// ties to even, like PyTorch's .to(dtype).
package fp

import (
	"encoding/binary"
	"math"
)

// f16Table maps every half-precision bit pattern to its float32 value; a table beats the
// branchy decode by about 4× and costs 256 KiB.
var f16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = decodeF16(uint16(i))
	}
	return &t
}()

func decodeF16(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: mant × 2^-24
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			return -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// F16ToF32 decodes an IEEE half-precision value.
func F16ToF32(h uint16) float32 { return f16Table[h] }

// F32ToF16 encodes f as IEEE half precision, rounding to nearest even; values beyond the
// half range become ±Inf and NaN stays NaN.
func F32ToF16(f float32) uint16 {
	return uint16(narrow(f, 5, 10, true))
}

// ExactF16 returns the F16 encoding of f and whether f is a finite F16 value, stored without
// rounding. Normal F16 values, the common case, take a few bit operations.
func ExactF16(f float32) (uint16, bool) {
	u := math.Float32bits(f)
	abs := u & 0x7fffffff
	// [2^−14, 2^16) with the low 13 mantissa bits clear: rebias the exponent by 127 − 15.
	if abs-0x38800000 < 0x47800000-0x38800000 && u&0x1fff == 0 {
		return uint16(u>>16&0x8000 | (abs-0x38000000)>>13), true
	}
	h := F32ToF16(f)
	return h, F16ToF32(h) == f && abs < 0x7f800000
}

// BF16ToF32 decodes a bfloat16 value (the top half of a float32).
func BF16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// DecodeBF16 decodes len(dst) little-endian BF16 values from src (len ≥ 2·len(dst)), four per
// 8-byte load: about twice as fast as one BF16ToF32 per value.
func DecodeBF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	i := 0
	for ; i+4 <= len(dst); i += 4 {
		x := binary.LittleEndian.Uint64(src[2*i:])
		d := dst[i : i+4 : i+4]
		d[0] = math.Float32frombits(uint32(x << 16))
		d[1] = math.Float32frombits(uint32(x) & 0xffff0000)
		d[2] = math.Float32frombits(uint32(x>>16) & 0xffff0000)
		d[3] = math.Float32frombits(uint32(x>>32) & 0xffff0000)
	}
	for ; i < len(dst); i++ {
		dst[i] = math.Float32frombits(uint32(src[2*i])<<16 | uint32(src[2*i+1])<<24)
	}
}

// F32ToBF16 encodes f as bfloat16, rounding to nearest even; NaN stays a quiet NaN.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// E4M3ToF32 decodes an FP8 E4M3FN value (bias 7, max 448, 0x7f/0xff are NaN, no infinities).
func E4M3ToF32(b uint8) float32 {
	if b&0x7f == 0x7f {
		return float32(math.NaN())
	}
	return widen(uint32(b), 4, 3)
}

// F32ToE4M3 encodes f as FP8 E4M3FN, rounding to nearest even and saturating to ±448
// (the convention of PyTorch's float8_e4m3fn casts used by quantizers, which clamp first).
func F32ToE4M3(f float32) uint8 {
	if f != f {
		return 0x7f
	}
	const max = 448
	if f > max {
		f = max
	} else if f < -max {
		f = -max
	}
	return uint8(narrow(f, 4, 3, false))
}

// E5M2ToF32 decodes an FP8 E5M2 value (bias 15, IEEE-like with infinities and NaNs).
func E5M2ToF32(b uint8) float32 {
	return F16ToF32(uint16(b) << 8)
}

// F32ToE5M2 encodes f as FP8 E5M2, rounding to nearest even; overflow gives ±Inf.
func F32ToE5M2(f float32) uint8 { return uint8(narrow(f, 5, 2, true)) }

// E8M0ToF32 decodes an E8M0 scale: 2^(b-127), with 0xff meaning NaN.
func E8M0ToF32(b uint8) float32 {
	if b == 0xff {
		return float32(math.NaN())
	}
	if b == 0 {
		return math.Float32frombits(0x00400000) // 2^-127 is a float32 subnormal
	}
	return math.Float32frombits(uint32(b) << 23)
}

// widen decodes a small float with the given exponent and mantissa widths (sign in the top
// bit, bias 2^(e-1)-1, subnormals, no special values) to float32.
func widen(bits uint32, expBits, mantBits uint) float32 {
	sign := bits >> (expBits + mantBits) & 1
	exp := int(bits>>mantBits) & (1<<expBits - 1)
	mant := bits & (1<<mantBits - 1)
	bias := 1<<(expBits-1) - 1
	var v float64
	if exp == 0 {
		v = math.Ldexp(float64(mant), 1-bias-int(mantBits))
	} else {
		v = math.Ldexp(float64(mant|1<<mantBits), exp-bias-int(mantBits))
	}
	if sign != 0 {
		v = -v
	}
	return float32(v)
}

// narrow encodes f into a float with expBits exponent bits and mantBits mantissa bits, rounding
// to nearest even. With ieee, the all-ones exponent holds Inf/NaN and overflow gives Inf;
// without it (E4M3FN) the caller has already saturated f into range.
func narrow(f float32, expBits, mantBits uint, ieee bool) uint32 {
	u := math.Float32bits(f)
	sign := (u >> 31) << (expBits + mantBits)
	abs := u & 0x7fffffff
	expMax := uint32(1<<expBits - 1)
	if abs >= 0x7f800000 { // Inf or NaN
		if abs > 0x7f800000 {
			return sign | expMax<<mantBits | 1<<(mantBits-1)
		}
		return sign | expMax<<mantBits
	}
	bias := int32(1<<(expBits-1) - 1)
	e := int32(abs>>23) - 127 // unbiased exponent of f
	shift := uint32(23 - mantBits)
	var m uint32 // the result's exponent and mantissa fields, before rounding
	if e+bias <= 0 {
		// Subnormal in the target: shift the full significand right with the rounding below.
		full := abs&0x7fffff | 0x800000
		if abs < 0x800000 {
			full = abs & 0x7fffff // float32 subnormal: far below any target subnormal
		}
		extra := uint32(1 - (e + bias))
		if shift+extra >= 32 {
			return sign
		}
		m = roundShift(full, shift+extra)
	} else {
		m = uint32(e+bias)<<mantBits + roundShift(abs&0x7fffff, shift)
		// roundShift may carry into the exponent field; that is the correct result.
	}
	if ieee && m >= expMax<<mantBits {
		return sign | expMax<<mantBits // overflow to Inf
	}
	return sign | m
}

// roundShift returns v >> s rounded to nearest, ties to even.
func roundShift(v uint32, s uint32) uint32 {
	if s == 0 {
		return v
	}
	q := v >> s
	rem := v & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++
	}
	return q
}

// E4M3FNUZToF32 decodes FP8 E4M3FNUZ (bias 8, no negative zero: 0x80 is the only NaN).
func E4M3FNUZToF32(b uint8) float32 {
	if b == 0x80 {
		return float32(math.NaN())
	}
	return widen(uint32(b), 4, 3) / 2
}

// E5M2FNUZToF32 decodes FP8 E5M2FNUZ (bias 16, no infinities, 0x80 is the only NaN).
func E5M2FNUZToF32(b uint8) float32 {
	if b == 0x80 {
		return float32(math.NaN())
	}
	return widen(uint32(b), 5, 2) / 2
}

// F4E2M1ToF32 decodes a 4-bit E2M1 (MXFP4 element) value held in the low nibble of b.
func F4E2M1ToF32(b uint8) float32 { return widen(uint32(b&0xf), 2, 1) }
