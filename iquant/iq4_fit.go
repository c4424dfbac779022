package iquant

import (
	"math"

	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// groupMaxEps is ggml's GROUP_MAX_EPS: below it a sub-block counts as all zero.
const groupMaxEps = 1e-15

// iq4Tries is ggml_quantize_chunk's ntry for iq4_nl and iq4_xs, with or without importance: the
// inverse scales (v₀ + t)/max for t = −7 … 7 are tried, v₀ = −127 the first code value.
const iq4Tries = 7

// fitIQ4 is quantize_row_iq4_nl_impl as ggml_quantize_chunk calls it: iq4_nl on a block of 32
// (its scale is d), iq4_xs on a block of 256 with sub-blocks of 32 (d = −(scale of largest
// magnitude)/32, sub-block scales round(scale/d) in −32…31). Each sub-block's scale is the best
// weighted least-squares fit over the inverse scales tried, codes are the nearest code values.
func fitIQ4(t *Type, _ *carry, x, imp []float32, p *Params) error {
	n := len(x)
	var sigma2 float32
	for _, v := range x {
		sigma2 += float32(v * v)
	}
	sigma2 *= 2 / float32(n)
	var scales [8]float32
	var weight [32]float32
	var maxScale, amaxScale float32
	for ib := range n / 32 {
		xb, L := x[32*ib:32*ib+32], p.Codes[32*ib:32*ib+32]
		for j, v := range xb {
			if imp != nil {
				weight[j] = imp[32*ib+j] * sqrt32(sigma2+float32(v*v))
			} else {
				weight[j] = v * v
			}
		}
		scales[ib] = iq4Scale(xb, weight[:], L)
		if a := abs32(scales[ib]); a > amaxScale {
			amaxScale, maxScale = a, scales[ib]
		}
	}
	if t.Type == quant.IQ4NL {
		p.D = quant.RoundF16(scales[0])
		var id float32
		if scales[0] != 0 {
			id = 1 / scales[0]
		}
		for j, v := range x {
			p.Codes[j] = iq4Code(id * v)
		}
		return nil
	}
	d := -maxScale / 32
	p.D = quant.RoundF16(d)
	var id float32
	if d != 0 {
		id = 1 / d
	}
	for ib := range n / 32 {
		l := clampInt(kquant.NearestInt(id*scales[ib]), -32, 31)
		p.Scales[ib] = int8(l)
		dl := d * float32(l)
		var idl float32
		if dl != 0 {
			idl = 1 / dl
		}
		for j, v := range x[32*ib : 32*ib+32] {
			p.Codes[32*ib+j] = iq4Code(idl * v)
		}
	}
	return nil
}

// iq4Scale fits one sub-block of 32: the scale −max/v₀ (max the weight of largest magnitude)
// with its codes in L, then its least-squares scale, then the inverse scales of iq4Tries.
// A sub-block below ggml's epsilon gets scale 0.
func iq4Scale(xb, weight []float32, L []uint8) float32 {
	var amax, max float32
	for _, v := range xb {
		if a := abs32(v); a > amax {
			amax, max = a, v
		}
	}
	if amax < groupMaxEps {
		return 0
	}
	v0 := float32(quant.IQ4Values[0])
	d := -max / v0
	sumqx, sumq2 := iq4Sums(xb, weight, 1/d, L)
	d = sumqx / sumq2
	best := d * sumqx
	for itry := -iq4Tries; itry <= iq4Tries; itry++ {
		id := float32(itry+int(quant.IQ4Values[0])) / max
		sumqx, sumq2 = iq4Sums(xb, weight, id, nil)
		if sumq2 > 0 && sumqx*sumqx > best*sumq2 {
			d = sumqx / sumq2
			best = d * sumqx
		}
	}
	return d
}

// iq4Sums codes xb at inverse scale id (into L unless nil) and returns Σ w·v·x and Σ w·v² of
// the code values v.
func iq4Sums(xb, weight []float32, id float32, L []uint8) (sumqx, sumq2 float32) {
	for j, v := range xb {
		l := iq4Code(id * v)
		if L != nil {
			L[j] = l
		}
		q, w := iq4Values[l], weight[j]
		sumqx += float32(float32(w*q) * v)
		sumq2 += float32(float32(w*q) * q)
	}
	return sumqx, sumq2
}

// iq4Values are quant.IQ4Values as float32.
var iq4Values = func() (v [16]float32) {
	for i, q := range quant.IQ4Values {
		v[i] = float32(q)
	}
	return v
}()

// iq4Below[m + 127] is the index l of the largest code value v_l ≤ m, for integers
// m = −127 … 112 (l ≤ 14).
var iq4Below = func() (t [240]uint8) {
	for m := range t {
		for l := 1; l < 15; l++ {
			if int(quant.IQ4Values[l]) <= m-127 {
				t[m] = uint8(l)
			}
		}
	}
	return t
}()

// iq4Code is ggml's best_index_int8 over the code values: the ends for values beyond them, else
// between the values v_l ≤ x < v_{l+1} the upper one unless x − v_l < v_{l+1} − x. ggml finds l
// by bisection; as the values are integers, v_l ≤ x exactly when v_l ≤ ⌊x⌋, so a table of ⌊x⌋
// gives the same l.
func iq4Code(x float32) uint8 {
	v := &iq4Values
	if !(x > v[0]) {
		if x != x { // NaN: ggml's bisection ends at the top
			return 15
		}
		return 0
	}
	if x >= v[15] {
		return 15
	}
	m := int32(x) // toward zero; one less for a negative x with a fraction
	if float32(m) > x {
		m--
	}
	l := iq4Below[m+127]
	if x-v[l] < v[l+1]-x {
		return l
	}
	return l + 1
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }
