package blockwise

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/qpack-dev/qpack/quant"
)

// params are one group's quantization parameters; each grid uses the fields it needs.
type params struct {
	scale, offset float32
	zero          uint8
	// small (integer grid): every |w/scale| of the group is below 2^20, so the encoder needs no
	// clamp before its float32 rounding (exact for |x| < 2^22).
	small bool
}

// span is min(w, 0) and max(w, 0) of a group, computed once per group (minMax).
type span struct{ lo, hi float32 }

// groupQuantizer is one grid's round-to-nearest: parameters from a group's weights (and their
// span), codes from parameters, values from codes. fit shrinks the group's range by p (p = 1 is
// plain RTN; the clip search tries smaller p).
type groupQuantizer interface {
	fit(w []float32, r span, p float32) params
	encode(codes []uint8, w []float32, pr params)
	decode(q uint8, pr params) float32
}

// quantizerFor returns the group quantizer of a grid fitted group by group; global is an NVFP4
// tensor's global scale. K-quants are fitted per super-block (kquant.go) and FP8 blocks across
// rows (fp8block.go); they have none, so asking for one is a programming error.
func quantizerFor(s quant.Scheme, global float32) groupQuantizer {
	switch s.Grid {
	case quant.NVFP4:
		return nvfp4Quantizer{global: global}
	case quant.MXFP4:
		return mxfp4Quantizer{}
	case quant.Integer:
		return intQuantizer{s}
	case quant.NF4:
		return nf4Quantizer{}
	case quant.FP8E4M3:
		return fp8Quantizer{}
	case quant.Binary:
		return binaryQuantizer{sym: s.Sym}
	}
	panic(fmt.Sprintf("blockwise: %s is not fitted group by group (k-quants: package kquant)", s))
}

// intQuantizer is the GPTQ reference quantizer: the range [min(w, 0), max(w, 0)] (±absmax when
// symmetric) shrunk by p, scale rounded to F16, zero = round(−xmin/scale) or 2^(bits−1).
type intQuantizer struct{ s quant.Scheme }

func (q intQuantizer) fit(_ []float32, r span, p float32) params {
	scale, zero := q.s.IntParamsRange(p*r.lo, p*r.hi)
	return params{scale: scale, zero: zero, small: r.absMax() < scale*(1<<20)}
}

// encode computes clamp(round_half_even(w/scale) + zero, 0, maxq) for each weight, where w/scale
// is the float32 division of quant.QuantizeInt and torch. It multiplies by the float32
// reciprocal instead, which may differ from the quotient in the last bits; that changes the
// code only when one of the two lies within nearTie of a rounding boundary k + 0.5, so exactly
// those weights are redone with the true division (roundQuotient).
func (q intQuantizer) encode(codes []uint8, w []float32, pr params) {
	codes = codes[:len(w)]
	zero, maxq := int32(pr.zero), int32(q.s.MaxQ())
	inv := 1 / pr.scale
	if !pr.small { // quotients may be huge: the plain definition
		for i, v := range w {
			codes[i] = uint8(min(max(int32(roundQuotient(v, pr.scale))+zero, 0), maxq))
		}
		return
	}
	// Adding zeroMagic = 1.5·2^23 + zero rounds x + zero to an integer held in the low bits of
	// the sum (float32 spacing is 1 there), so the code is read from those bits. Unless x is a
	// tie, round(x + zero) = round(x) + zero, and r = round(x) is recovered exactly; a tie has
	// |d| = 0.5 and takes the true division, which rounds x alone.
	zeroMagic := float32(roundMagic + float32(pr.zero))
	if hasAVX2 && len(w) >= 8 {
		n := len(w) &^ 7
		encodeIntChunks(codes[:n], w[:n], pr, inv, zeroMagic, zero, maxq)
		codes, w = codes[n:], w[n:]
	}
	for i, v := range w {
		x := float32(v * inv)
		y := float32(x + zeroMagic)
		r := float32(y - zeroMagic)
		c := int32(math.Float32bits(y) - roundMagicBits)
		// d = x − r is exact (|d| ≤ 0.5, |x| < 2^21); compare |d| by its bits.
		if math.Float32bits(x-r)&0x7fffffff > nearTieBits {
			c = int32(roundQuotient(v, pr.scale)) + zero
		}
		if uint32(c) > uint32(maxq) { // rare: only at the edges of the range
			c = min(max(c, 0), maxq)
		}
		codes[i] = uint8(c)
	}
}

// encodeIntChunks is encode's fast path on the AVX2 kernel (len(w) a multiple of 8): the same
// codes, the kernel flagging the near-ties that take the true division here.
func encodeIntChunks(codes []uint8, w []float32, pr params, inv, zeroMagic float32, zero, maxq int32) {
	var ties [64]uint8
	for c0 := 0; c0 < len(w); c0 += 8 * len(ties) {
		n := min(8*len(ties), len(w)-c0)
		encodeIntAVX2(&codes[c0], &ties[0], &w[c0], n, inv, zeroMagic, roundMagicBits, nearTieBits, maxq)
		for j, m := range ties[:n/8] {
			for ; m != 0; m &= m - 1 {
				i := c0 + 8*j + bits.TrailingZeros8(m)
				codes[i] = uint8(min(max(int32(roundQuotient(w[i], pr.scale))+zero, 0), maxq))
			}
		}
	}
}

// nearTieBits are the bits of 0.5 − nearTie: a non-negative float32 exceeds it exactly when
// its bits do.
var nearTieBits = math.Float32bits(0.5 - nearTie)

// roundMagicBits are the bits of roundMagic; the float32 roundMagic + j has bits
// roundMagicBits + j for |j| < 2^22.
var roundMagicBits = math.Float32bits(roundMagic)

// nearTie bounds how far x = fl(w·fl(1/s)) can be from fl(w/s) where it matters: the two
// roundings of x and the one of the quotient are relative errors of at most 2^−24 each, so for
// |x| ≤ 257 the gap is below 257·3·2^−24 < 2^−14 (underflow adds at most 2^−149). If x is
// further than nearTie from every boundary k + 0.5, the quotient lies strictly on the same side
// of it, and both round to the same integer. Beyond |x| > 257 the gap may exceed nearTie, but
// the quotient is then beyond ±256 too and every such x and quotient clamps to the same code.
const nearTie = 1.0 / (1 << 12)

// roundQuotient is round_half_even(w/scale) with the true float32 division. The quotient is
// clamped to ±256, which changes no code, and rounded in float32 by adding and subtracting
// 1.5·2^23: the sum lands where float32's spacing is 1, so the hardware rounds it half to even,
// the same result as math.RoundToEven for |x| < 2^22 (the float32 conversion keeps the compiler
// from fusing).
func roundQuotient(v, scale float32) float32 {
	x := clampQuotient(v / scale)
	return float32(x+roundMagic) - roundMagic
}

func clampQuotient(x float32) float32 {
	if x > 256 {
		return 256
	} else if x < -256 {
		return -256
	}
	return x
}

// roundMagic is 1.5·2^23: for |x| < 2^22, float32(x + roundMagic) − roundMagic is x rounded
// to the nearest integer, ties to even.
const roundMagic = 12582912

func (intQuantizer) decode(c uint8, pr params) float32 {
	return quant.DequantizeInt(c, pr.scale, pr.zero)
}

// nf4Quantizer: scale = F16(p·absmax), code = nearest NF4 value of w/scale (ties to the lower
// index, see quant.NF4Code).
type nf4Quantizer struct{}

func (nf4Quantizer) fit(_ []float32, r span, p float32) params {
	return params{scale: quant.NF4Scale(p * r.absMax())}
}

func (nf4Quantizer) encode(codes []uint8, w []float32, pr params) {
	codes = codes[:len(w)]
	for i, v := range w {
		codes[i] = quant.NF4Code(v / pr.scale)
	}
}

func (nf4Quantizer) decode(c uint8, pr params) float32 { return quant.DequantizeNF4(c, pr.scale) }

// fp8Quantizer: one float32 scale p·absmax/448 per output channel, code = E4M3(w/scale).
type fp8Quantizer struct{}

func (fp8Quantizer) fit(_ []float32, r span, p float32) params {
	return params{scale: quant.FP8Scale(p * r.absMax())}
}

func (fp8Quantizer) encode(codes []uint8, w []float32, pr params) {
	codes = codes[:len(w)]
	for i, v := range w {
		codes[i] = quant.FP8Code(v, pr.scale)
	}
}

func (fp8Quantizer) decode(c uint8, pr params) float32 { return quant.DequantizeFP8(c, pr.scale) }

// binaryQuantizer: sign codes around the offset (0 when symmetric) with scale mean|w − offset|;
// clipping shrinks the scale by p (then rounds it to F16 again).
type binaryQuantizer struct{ sym bool }

func (q binaryQuantizer) fit(w []float32, _ span, p float32) params {
	scale, offset := quant.BinaryParams(w, q.sym)
	if p != 1 {
		scale = quant.RoundF16(p * scale)
		if scale == 0 {
			scale = quant.MinF16Scale
		}
	}
	return params{scale: scale, offset: offset}
}

func (binaryQuantizer) encode(codes []uint8, w []float32, pr params) {
	codes = codes[:len(w)]
	for i, v := range w {
		codes[i] = quant.BinaryCode(v, pr.offset)
	}
}

func (binaryQuantizer) decode(c uint8, pr params) float32 {
	return quant.DequantizeBinary(c, pr.scale, pr.offset)
}

// minMax returns the span of w: min(w, 0) and max(w, 0). It compares order-preserving integer
// keys of the float bits, two lanes at a time: branch-free and several times faster than float
// comparisons or the NaN-aware builtins on random data. A NaN or infinity in w makes the span
// non-finite (its key lies beyond those of all finite values), which is how quantizeRow finds
// bad weights without a separate pass.
func minMax(w []float32) span {
	var lo0, hi0, lo1, hi1 int32 // key(0) = 0 puts 0 in the range
	i := 0
	for ; i+2 <= len(w); i += 2 {
		k0, k1 := orderKey(w[i]), orderKey(w[i+1])
		lo0, hi0 = min(lo0, k0), max(hi0, k0)
		lo1, hi1 = min(lo1, k1), max(hi1, k1)
	}
	lo, hi := min(lo0, lo1), max(hi0, hi1)
	if i < len(w) {
		k := orderKey(w[i])
		lo, hi = min(lo, k), max(hi, k)
	}
	return span{fromOrderKey(lo), fromOrderKey(hi)}
}

// orderKey maps a float32 to an int32 with the same order (−0 just below +0, NaNs beyond the
// infinities): negative floats have their magnitude bits flipped.
func orderKey(v float32) int32 { return bitsKey(math.Float32bits(v)) }

// bitsKey is orderKey of the float32 with bits u.
func bitsKey(u uint32) int32 {
	k := int32(u)
	return k ^ (k >> 31 & 0x7fffffff)
}

func fromOrderKey(k int32) float32 {
	return math.Float32frombits(uint32(k ^ (k >> 31 & 0x7fffffff)))
}

func (r span) absMax() float32 { return max(-r.lo, r.hi) }

func (r span) finite() bool { return finite(r.lo) && finite(r.hi) }
