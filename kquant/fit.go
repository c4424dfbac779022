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

// sweep is the grid fitScaleMin searches for a sub-block's scale and min: inverse scales
// (rmin + rdelta·is + nmax)/range for is = 0 … nstep, error |Δ| (mad) or Δ².
type sweep struct {
	rmin, rdelta float32
	nstep        int
	mad          bool
}

// refSweeps are quantize_row_qX_K_ref's sweeps of the types with mins; impl's is one for all.
var (
	refSweeps = map[int]sweep{2: {-0.5, 0.1, 15, true}, 4: {-1, 0.1, 20, false}, 5: {-0.5, 0.1, 15, false}}
	implSweep = sweep{-0.9, 0.05, 36, false}
)

// fitMinsRef is quantize_row_q2_K_ref, quantize_row_q4_K_ref and quantize_row_q5_K_ref: each
// sub-block's scale and min fitted alone (weights |x| for q2_k, rms(x) + |x| for the others),
// then the scales and mins as fractions of the largest of each.
func fitMinsRef(t *Type, x []float32, codes []uint8) Params {
	var scales, mins [MaxSubBlocks]float32
	var weights [quant.SuperBlock]float32
	nsub := len(x) / t.Sub
	for j := range nsub {
		refWeights(t, weights[t.Sub*j:t.Sub*(j+1)], x[t.Sub*j:t.Sub*(j+1)])
	}
	fitSubBlocks(t, x, weights[:len(x)], codes, refSweeps[t.Bits], scales[:nsub], mins[:nsub])
	var p Params
	var ls, lm [MaxSubBlocks]uint8
	p.D = quantizeToMax(scales[:nsub], ls[:], float32(t.ScaleHi))
	p.DMin = quantizeToMax(mins[:nsub], lm[:], float32(t.MinHi))
	p.setScalesMins(t, ls[:nsub], lm[:nsub])
	t.requantize(&p, x, codes)
	return p
}

// fitSubBlocks fits every sub-block of x alone with fitScaleMin over the sweep sw (weights w,
// one per value), eight sub-blocks of 32 at a time on the AVX2 kernel where it applies.
func fitSubBlocks(t *Type, x, w []float32, codes []uint8, sw sweep, scales, mins []float32) {
	if t.Sub == 32 && fitScaleMin8(int32(t.maxq), x, w, codes, sw, scales, mins) {
		return
	}
	var aux [32]uint8
	for j := range scales {
		lo, hi := t.Sub*j, t.Sub*(j+1)
		scales[j], mins[j] = fitScaleMin(int32(t.maxq), x[lo:hi], w[lo:hi], codes[lo:], aux[:], sw.rmin, sw.rdelta, sw.nstep, sw.mad)
	}
}

// refWeights are the weights of a sub-block in the _ref fits: |x| for q2_k; for q4_k and q5_k
// rms(x) + |x|.
func refWeights(t *Type, w, x []float32) {
	var avX float32
	if t.Bits != 2 {
		var sumX2 float32
		for _, v := range x {
			sumX2 += float32(v * v)
		}
		avX = sqrt32(sumX2 / float32(len(x)))
	}
	for i, v := range x {
		w[i] = avX + abs32(v)
	}
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
		l[j] = uint8(NearestInt(iscale * s))
	}
	return f16(max / q)
}

// fitMinsImpl is quantize_row_q2_K_impl, quantize_row_q4_K_impl and quantize_row_q5_K_impl:
// sub-blocks fitted with importance weights over the finer sweep, then scales and mins by
// make_qp_quants weighted by each sub-block's total weight.
func fitMinsImpl(t *Type, x, qw []float32, codes []uint8) Params {
	var scales, mins, sw [MaxSubBlocks]float32
	var weights [quant.SuperBlock]float32
	factor := float32(2)
	if t.Bits == 2 {
		factor = 1
	}
	sigma2, nsub := superSigma2(x, factor), len(x)/t.Sub
	for j := range nsub {
		lo, hi := t.Sub*j, t.Sub*(j+1)
		sw[j] = importanceWeights(weights[lo:hi], x[lo:hi], qw[lo:hi], sigma2)
	}
	fitSubBlocks(t, x, weights[:len(x)], codes, implSweep, scales[:nsub], mins[:nsub])
	var p Params
	var ls, lm [MaxSubBlocks]uint8
	p.D = f16(fitPositive(int32(t.ScaleHi), scales[:nsub], ls[:], sw[:nsub]))
	p.DMin = f16(fitPositive(int32(t.MinHi), mins[:nsub], lm[:], sw[:nsub]))
	p.setScalesMins(t, ls[:nsub], lm[:nsub])
	t.requantize(&p, x, codes)
	return p
}

// setScalesMins stores the sub-block scales and mins as ggml's block holds them: q2_k packs
// them into one byte, scale | min<<4, and reads them back from it; q4_k and q5_k cap them at 63.
func (p *Params) setScalesMins(t *Type, ls, lm []uint8) {
	for j := range ls {
		if t.Bits == 2 {
			b := ls[j] | lm[j]<<4
			p.Scales[j], p.Mins[j] = int8(b&15), b>>4
		} else {
			p.Scales[j], p.Mins[j] = int8(min(63, ls[j])), min(63, lm[j])
		}
	}
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
			p.Scales[j] = int8(clamp(int32(int8(NearestInt(iscale*scales[j]))), -32, 31))
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
		p.Scales[j] = int8(min(127, NearestInt(iscale*scales[j])))
	}
	t.requantize(&p, x, codes)
	return p
}
