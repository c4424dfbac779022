package quant

import "math"

// NF4Values are the 16 NF4 code values of bitsandbytes (get_4bit_type("nf4")), as float32:
// quantiles of N(0, 1) scaled to [−1, 1], with an exact 0 at index 7.
var NF4Values = [16]float32{
	-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
	-0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
	0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
	0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
}

// nf4Thresholds[i] decides between codes i and i+1: x > nf4Thresholds[i] means x is strictly
// above the exact midpoint of NF4Values[i] and NF4Values[i+1]. Each threshold is the exact
// (float64) midpoint rounded toward −∞ to float32, so that the float32 comparison x > t agrees
// with the exact comparison x > midpoint for every float32 x (a GPU kernel can use this table).
// A 16th entry (+Inf, never reached) lets NF4Code index with a mask instead of a bounds check.
var nf4Thresholds = func() [16]float32 {
	t := [16]float32{15: float32(math.Inf(1))}
	for i := range 15 {
		mid := (float64(NF4Values[i]) + float64(NF4Values[i+1])) / 2 // exact in float64
		f := float32(mid)
		if float64(f) > mid {
			f = math.Nextafter32(f, float32(math.Inf(-1)))
		}
		t[i] = f
	}
	return t
}()

// NF4Thresholds returns the 15 decision thresholds of NF4Code (see nf4Thresholds).
func NF4Thresholds() [15]float32 { return [15]float32(nf4Thresholds[:15]) }

// NF4Code returns the index of the NF4 value nearest to x (x is w/scale, normally in [−1, 1];
// values outside saturate to codes 0 and 15). A tie, x exactly on a midpoint, goes to the lower
// index. The code is the number of thresholds that x exceeds.
func NF4Code(x float32) uint8 {
	// A branch-free binary search over the sorted thresholds (weights are random, so branches
	// would mispredict half the time). above(t) is 1 when x > t: t − x is negative exactly then
	// (for finite floats the difference is 0 only when they are equal).
	t := &nf4Thresholds
	above := func(t float32) uint32 { return math.Float32bits(t-x) >> 31 }
	lo := above(t[7]) << 3
	lo |= above(t[(lo+3)&15]) << 2
	lo |= above(t[(lo+1)&15]) << 1
	lo |= above(t[lo&15])
	return uint8(lo)
}

// NF4Scale returns the scale of one NF4 group from its absolute maximum: absmax rounded to F16,
// so that packed F16 scales reproduce the codes. An all-zero group gets scale 1 (every code is
// then 7, the exact zero); an absmax below F16's smallest subnormal gets that subnormal.
func NF4Scale(absmax float32) float32 {
	if absmax == 0 {
		return 1
	}
	s := RoundF16(absmax)
	if s == 0 {
		s = MinF16Scale
	}
	return s
}

// DequantizeNF4 returns scale·NF4Values[q].
func DequantizeNF4(q uint8, scale float32) float32 { return scale * NF4Values[q&15] }
