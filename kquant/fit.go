package kquant

import "github.com/qpack-dev/qpack/quant"

// The fitting of one super-block per type: ggml's quantize_row_qX_K_ref without importance and
// quantize_row_qX_K_impl with it, generalised to a short last super-block (n weights, a whole
// number of sub-blocks, where ggml has 256). Each works in three steps: fit every sub-block
// alone (float scale, min and codes), quantize those scales and mins against the F16 super-block
// scales, then compute the codes again with the stored parameters (requantize).

// f16 is what a float32 becomes once stored as ggml's F16 and read back.
func f16(v float32) float32 { return quant.RoundF16(v) }

// superSigma2 is ggml's σ² of a super-block: factor·Σx²/n (factor 1 for q2_k, 2 otherwise).
func superSigma2(x []float32, factor float32) float32 {
	var sum float32
	for _, v := range x {
		sum += float32(v * v)
	}
	return factor * sum / float32(len(x))
}

// importanceWeights fills w with ggml's weights of a sub-block under importance qw:
// qw_i·sqrt(σ² + x_i²), and returns their sum.
func importanceWeights(w, x, qw []float32, sigma2 float32) float32 {
	var sum float32
	for i, v := range x {
		w[i] = qw[i] * sqrt32(sigma2+float32(v*v))
		sum += w[i]
	}
	return sum
}

// fitQ2Ref is quantize_row_q2_K_ref: sub-blocks of 16 fitted with weights |x| and the mean
// absolute error, then scales and mins as 4-bit fractions of the largest of each.
func fitQ2Ref(t *Type, x []float32, codes []uint8) Params {
	var scales, mins, weights [16]float32
	var aux [16]uint8
	for j := range len(x) / 16 {
		sub := x[16*j : 16*j+16]
		for l, v := range sub {
			weights[l] = abs32(v)
		}
		scales[j], mins[j] = fitScaleMin(3, sub, weights[:], codes[16*j:], aux[:], -0.5, 0.1, 15, true)
	}
	var p Params
	var ls, lm [16]uint8
	p.D = quantizeToMax(scales[:len(x)/16], ls[:], 15)
	p.DMin = quantizeToMax(mins[:len(x)/16], lm[:], 15)
	p.setPacked4(ls, lm)
	t.requantize(&p, x, codes)
	return p
}

// quantizeToMax is the _ref types' sub-scale step: l_j = round(v_j·q/max) against the largest
// v (stored as ggml's uint8, which wraps a negative l), returning the stored F16 of max/q; with
// no positive v, l = 0 and 0.
func quantizeToMax(v []float32, l []uint8, q float32) float32 {
	var max float32
	for _, s := range v {
		max = maxC(max, s)
	}
	if !(max > 0) {
		clear(l[:len(v)])
		return f16(0)
	}
	iscale := q / max
	for j, s := range v {
		l[j] = uint8(nearestInt(iscale * s))
	}
	return f16(max / q)
}

// setPacked4 stores q2_k's scales and mins as ggml packs them, scale | min<<4 in one byte, and
// reads them back from that byte (so an out-of-range value becomes what ggml's block holds).
func (p *Params) setPacked4(ls, lm [16]uint8) {
	for j := range ls {
		b := ls[j] | lm[j]<<4
		p.Scales[j], p.Mins[j] = int8(b&15), b>>4
	}
}

// fitQ2Impl is quantize_row_q2_K_impl: sub-blocks fitted with importance weights and the squared
// error over a finer sweep, then scales and mins by make_qp_quants weighted by each sub-block's
// total weight.
func fitQ2Impl(t *Type, x, qw []float32, codes []uint8) Params {
	var scales, mins, sw, weights [16]float32
	var aux [16]uint8
	sigma2 := superSigma2(x, 1)
	nsub := len(x) / 16
	for j := range nsub {
		sub := x[16*j : 16*j+16]
		sw[j] = importanceWeights(weights[:], sub, qw[16*j:], sigma2)
		scales[j], mins[j] = fitScaleMin(3, sub, weights[:], codes[16*j:], aux[:], -0.9, 0.05, 36, false)
	}
	var p Params
	var ls, lm [16]uint8
	p.D = f16(fitPositive(15, scales[:nsub], ls[:], sw[:nsub]))
	p.DMin = f16(fitPositive(15, mins[:nsub], lm[:], sw[:nsub]))
	p.setPacked4(ls, lm)
	t.requantize(&p, x, codes)
	return p
}

// fitQ3Ref is quantize_row_q3_K_ref: sub-blocks of 16 by make_q3_quants, then signed 6-bit
// scales against the scale of largest magnitude, which gets −32 (d may be negative).
func fitQ3Ref(t *Type, x []float32, codes []uint8) Params {
	var scales [16]float32
	nsub := len(x) / 16
	for j := range nsub {
		scales[j] = fitQ3(4, x[16*j:16*j+16], codes[16*j:])
	}
	var p Params
	for j := range nsub {
		p.Scales[j] = -32 // ggml's zeroed bytes when every scale is 0
	}
	if max, _ := signedMax(scales[:nsub]); max != 0 {
		iscale := -32 / max
		for j := range nsub {
			p.Scales[j] = int8(clamp(int32(int8(nearestInt(iscale*scales[j]))), -32, 31))
		}
		p.D = f16(1 / iscale)
	}
	t.requantize(&p, x, codes)
	return p
}

// fitQ3Impl is quantize_row_q3_K_impl: sub-blocks by make_qx_quants with importance weights,
// then the 6-bit scales by make_qx_quants over the sub-block scales, weighted by their totals.
func fitQ3Impl(t *Type, x, qw []float32, codes []uint8) Params {
	var scales, sw, weights [16]float32
	sigma2 := superSigma2(x, 2)
	nsub := len(x) / 16
	for j := range nsub {
		sub := x[16*j : 16*j+16]
		sw[j] = importanceWeights(weights[:], sub, qw[16*j:], sigma2)
		scales[j] = fitSymmetric(4, sub, codes[16*j:], weights[:])
	}
	var p Params
	var ls [16]uint8
	p.D = f16(fitSymmetric(32, scales[:nsub], ls[:], sw[:nsub]))
	for j := range nsub {
		p.Scales[j] = int8(ls[j]) - 32
	}
	t.requantize(&p, x, codes)
	return p
}

// fitQ45Ref is quantize_row_q4_K_ref and quantize_row_q5_K_ref: sub-blocks of 32 fitted with
// weights rms(x) + |x|, then 6-bit scales and mins as fractions of the largest of each.
func fitQ45Ref(t *Type, x []float32, codes []uint8) Params {
	rmin, nstep := float32(-1), 20 // q4_k
	if t.Bits == 5 {
		rmin, nstep = -0.5, 15
	}
	var scales, mins [8]float32
	var weights [32]float32
	var aux [32]uint8
	nsub := len(x) / 32
	for j := range nsub {
		sub := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range sub {
			sumX2 += float32(v * v)
		}
		avX := sqrt32(sumX2 / 32)
		for l, v := range sub {
			weights[l] = avX + abs32(v)
		}
		scales[j], mins[j] = fitScaleMin(int32(t.maxq), sub, weights[:], codes[32*j:], aux[:], rmin, 0.1, nstep, false)
	}
	var p Params
	var ls, lm [8]uint8
	p.D = quantizeToMax(scales[:nsub], ls[:], 63)
	p.DMin = quantizeToMax(mins[:nsub], lm[:], 63)
	p.setScalesMins6(ls[:nsub], lm[:nsub])
	t.requantize(&p, x, codes)
	return p
}

// setScalesMins6 stores 6-bit scales and mins, capped at 63 as ggml caps them.
func (p *Params) setScalesMins6(ls, lm []uint8) {
	for j := range ls {
		p.Scales[j], p.Mins[j] = int8(min(63, ls[j])), min(63, lm[j])
	}
}

// fitQ45Impl is quantize_row_q4_K_impl and quantize_row_q5_K_impl: sub-blocks fitted with
// importance weights over a finer sweep, then scales and mins by make_qp_quants.
func fitQ45Impl(t *Type, x, qw []float32, codes []uint8) Params {
	var scales, mins, sw [8]float32
	var weights [32]float32
	var aux [32]uint8
	sigma2 := superSigma2(x, 2)
	nsub := len(x) / 32
	for j := range nsub {
		sub := x[32*j : 32*j+32]
		sw[j] = importanceWeights(weights[:], sub, qw[32*j:], sigma2)
		scales[j], mins[j] = fitScaleMin(int32(t.maxq), sub, weights[:], codes[32*j:], aux[:], -0.9, 0.05, 36, false)
	}
	var p Params
	var ls, lm [8]uint8
	p.D = f16(fitPositive(63, scales[:nsub], ls[:], sw[:nsub]))
	p.DMin = f16(fitPositive(63, mins[:nsub], lm[:], sw[:nsub]))
	p.setScalesMins6(ls[:nsub], lm[:nsub])
	t.requantize(&p, x, codes)
	return p
}

// fitQ6 is quantize_row_q6_K_ref (qw nil) and quantize_row_q6_K_impl: sub-blocks of 16 by
// make_qx_quants (weights x², or the importance itself), then int8 scales against the scale of
// largest magnitude, which gets −128. A super-block whose scales are all below ggml's epsilon
// is stored as zeros (codes included).
func fitQ6(t *Type, x, qw []float32, codes []uint8) Params {
	var scales [16]float32
	nsub := len(x) / 16
	for j := range nsub {
		var w []float32
		if qw != nil {
			w = qw[16*j : 16*j+16]
		}
		scales[j] = fitSymmetric(32, x[16*j:16*j+16], codes[16*j:], w)
	}
	var p Params
	max, amax := signedMax(scales[:nsub])
	if amax < groupMaxEps {
		clear(codes[:len(x)])
		return p
	}
	iscale := -128 / max
	p.D = f16(1 / iscale)
	for j := range nsub {
		p.Scales[j] = int8(min(127, nearestInt(iscale*scales[j])))
	}
	t.requantize(&p, x, codes)
	return p
}
