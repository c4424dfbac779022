package kquant

import "math"

// The searches ggml's k-quant quantizers are built from (ggml-quants.c: nearest_int,
// make_qx_quants, make_q3_quants, make_qkx2_quants/make_qkx3_quants, make_qp_quants), in
// float32 with ggml's operations in ggml's order so that the results are ggml's bit for bit.
// Every product that is then added or subtracted is converted to float32 explicitly: Go may
// otherwise fuse the two into one multiply-add (rounding once), C as ggml builds it does not.
// n ≤ 32 everywhere (a sub-block's weights, or a super-block's sub-block scales).

// groupMaxEps is ggml's GROUP_MAX_EPS: below it a group counts as all zero.
const groupMaxEps = 1e-15

// NearestInt rounds x to the nearest integer, ties to even, as ggml's nearest_int: adding
// 1.5·2^23 in float32 leaves the rounded value in the low mantissa bits. Like ggml's, it is
// meant for |x| < 2^22; larger values give the same (meaningless) results as ggml's.
func NearestInt(x float32) int32 {
	v := x + 12582912
	return int32(math.Float32bits(v)&0x7fffff) - 0x400000
}

func clamp(l, lo, hi int32) int32 { return min(max(l, lo), hi) }

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

func sqrt32(v float32) float32 { return float32(math.Sqrt(float64(v))) } // exact as sqrtf

// signedMax returns the value of largest magnitude in x (the first on ties) and its magnitude.
func signedMax(x []float32) (max, amax float32) {
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, max = a, v
		}
	}
	return max, amax
}

// weightOr returns w[i], or x[i]² without weights.
func weightOr(w, x []float32, i int) float32 {
	if w != nil {
		return w[i]
	}
	return x[i] * x[i]
}

// fitSymmetric is make_qx_quants with rmse_type 1: codes L_i = l_i + nmax with l_i in
// [−nmax, nmax−1] for x ≈ scale·l, minimising Σ w_i·(x_i − scale·l_i)² (w = qw, or x² without).
// The inverse scale starts at −nmax/max (max the value of largest magnitude, so the extreme
// weight gets l = −nmax) and then tries −(nmax + 0.1·is)/max for is = −9 … 9, keeping the codes
// whose least-squares scale explains the most (Σwxl)²/Σwl². All-zero x gives L = 0, scale 0.
func fitSymmetric(nmax int32, x []float32, L []uint8, qw []float32) float32 {
	max, amax := signedMax(x)
	if amax < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	sums := func(iscale float32, store bool) (sumlx, suml2 float32) {
		for i, v := range x {
			l := clamp(NearestInt(iscale*v), -nmax, nmax-1)
			if store {
				L[i] = uint8(l + nmax)
			}
			w, fl := weightOr(qw, x, i), float32(l)
			sumlx += float32(w * v * fl)
			suml2 += float32(w * fl * fl)
		}
		return sumlx, suml2
	}
	sumlx, suml2 := sums(-float32(nmax)/max, true)
	var scale float32
	if suml2 != 0 {
		scale = sumlx / suml2
	}
	best := scale * sumlx
	for is := int32(-9); is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale := -(float32(nmax) + float32(0.1*float32(is))) / max
		sumlx, suml2 = sums(iscale, false)
		if suml2 > 0 && sumlx*sumlx > best*suml2 {
			sums(iscale, true)
			scale = sumlx / suml2
			best = scale * sumlx
		}
	}
	return scale
}

// fitQ3 is make_q3_quants with do_rmse: the start of fitSymmetric (without the scale sweep),
// then up to five rounds of moving single codes l_i to round(x_i·Σ'wl²/Σ'wxl) (the sums without
// i) while that raises (Σwxl)²/Σwl², with w = x². Codes are l + nmax as in fitSymmetric.
func fitQ3(nmax int32, x []float32, L []uint8) float32 {
	max, amax := signedMax(x)
	if amax < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	iscale := -float32(nmax) / max
	var ls [32]int32
	var sumlx, suml2 float32
	for i, v := range x {
		ls[i] = clamp(NearestInt(iscale*v), -nmax, nmax-1)
		w, fl := v*v, float32(ls[i])
		sumlx += float32(w * v * fl)
		suml2 += float32(w * fl * fl)
	}
	for range 5 {
		changed := false
		for i, v := range x {
			w, fl := v*v, float32(ls[i])
			slx := sumlx - float32(w*v*fl)
			if !(slx > 0) {
				continue
			}
			sl2 := suml2 - float32(w*fl*fl)
			nl := clamp(NearestInt(v*sl2/slx), -nmax, nmax-1)
			if nl == ls[i] {
				continue
			}
			fn := float32(nl)
			slx += float32(w * v * fn)
			sl2 += float32(w * fn * fn)
			if sl2 > 0 && slx*slx*suml2 > sumlx*sumlx*sl2 {
				ls[i], sumlx, suml2 = nl, slx, sl2
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	for i := range x {
		L[i] = uint8(ls[i] + nmax)
	}
	if suml2 > 0 {
		return sumlx / suml2
	}
	return 0
}

// fitScaleMin is make_qkx2_quants (and make_qkx3_quants, the same with weights given): codes
// L_i in [0, nmax] for x ≈ scale·L − min (min ≥ 0 returned), minimising Σ w_i·err_i with
// err = |Δ| (mad) or Δ². It starts from the range [min(x, 0), max(x)] and tries the inverse
// scales (rmin + rdelta·is + nmax)/range for is = 0 … nstep, each with the weighted
// least-squares scale and offset of its codes (offset clamped to ≤ 0); the first smallest error
// wins. aux is scratch (len(x)).
func fitScaleMin(nmax int32, x, w []float32, L, aux []uint8, rmin, rdelta float32, nstep int, mad bool) (scale, negMin float32) {
	lo, hi := x[0], x[0]
	sumW := w[0]
	sumX := sumW * x[0]
	for i := 1; i < len(x); i++ {
		lo, hi = minC(lo, x[i]), maxC(hi, x[i])
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		clear(L[:len(x)])
		return 0, -lo
	}
	iscale := float32(nmax) / (hi - lo)
	scale = 1 / iscale
	bestErr := float32(0)
	for i, v := range x {
		L[i] = uint8(clamp(NearestInt(iscale*(v-lo)), 0, nmax))
		bestErr += float32(w[i] * errorOf(float32(scale*float32(L[i]))+lo-v, mad))
	}
	for is := range nstep + 1 {
		iscale = (float32(rmin+float32(rdelta*float32(is))) + float32(nmax)) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i, v := range x {
			l := clamp(NearestInt(iscale*(v-lo)), 0, nmax)
			aux[i] = uint8(l)
			fl := float32(l)
			sumL += float32(w[i] * fl)
			sumL2 += float32(w[i] * fl * fl)
			sumXL += float32(w[i] * fl * v)
		}
		d := float32(sumW*sumL2) - float32(sumL*sumL)
		if !(d > 0) {
			continue
		}
		thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / d
		thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / d
		if thisMin > 0 {
			thisMin, thisScale = 0, sumXL/sumL2
		}
		var e float32
		for i, v := range x {
			e += float32(w[i] * errorOf(float32(thisScale*float32(aux[i]))+thisMin-v, mad))
		}
		if e < bestErr {
			copy(L[:len(x)], aux[:len(x)])
			bestErr, scale, lo = e, thisScale, thisMin
		}
	}
	return scale, -lo
}

// errorOf is |d| (mad) or d².
func errorOf(d float32, mad bool) float32 {
	if mad {
		return abs32(d)
	}
	return d * d
}

// minC and maxC compare like C's `if (x < m) m = x` (Go's min and max treat −0 and NaN
// differently, which would change which zero ggml keeps).
func minC(m, x float32) float32 {
	if x < m {
		return x
	}
	return m
}

func maxC(m, x float32) float32 {
	if x > m {
		return x
	}
	return m
}

// fitPositive is make_qp_quants as the k-quant fits use it: codes L_i in [0, nmax] for
// non-negative x ≈ scale·L (sub-block scales or mins, weighted by qw), the least-squares scale
// of QPQuants' codes; 0 when every x is below ggml's epsilon or no code is weighted.
func fitPositive(nmax int32, x []float32, L []uint8, qw []float32) float32 {
	var max float32
	for _, v := range x {
		if !(max > v) {
			max = v
		}
	}
	if max < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	sumlx, suml2 := QPQuants(nmax, x, L, qw)
	if suml2 > 0 {
		return sumlx / suml2
	}
	return 0
}

// QPQuants is the body of ggml's make_qp_quants (which returns sumlx/suml2, NaN for 0/0) for x
// with a positive maximum: the inverse scale (nmax + 0.1·is)/max for is = −4 … 4 with the
// smallest weighted squared error, then up to five rounds of moving single codes as in fitQ3.
// It returns Σ qw·x·l and Σ qw·l² of the final codes. Codes are stored as ggml's uint8 L (a
// negative code would wrap, as in ggml).
func QPQuants(nmax int32, x []float32, L []uint8, qw []float32) (sumlx, suml2 float32) {
	var max float32
	for _, v := range x {
		if !(max > v) {
			max = v
		}
	}
	iscale := float32(nmax) / max
	for i, v := range x {
		L[i] = uint8(NearestInt(iscale * v))
	}
	bestMSE := squaredError(x, qw, 1/iscale, func(i int) float32 { return float32(L[i]) })
	for is := int32(-4); is <= 4; is++ {
		if is == 0 {
			continue
		}
		isc := (float32(0.1*float32(is)) + float32(nmax)) / max
		mse := squaredError(x, qw, 1/isc, func(i int) float32 { return float32(min(nmax, NearestInt(isc*x[i]))) })
		if mse < bestMSE {
			bestMSE, iscale = mse, isc
		}
	}
	for i, v := range x {
		l := min(nmax, NearestInt(iscale*v))
		L[i] = uint8(l)
		fl := float32(l)
		sumlx += float32(qw[i] * v * fl)
		suml2 += float32(qw[i] * fl * fl)
	}
	for range 5 {
		changed := false
		for i, v := range x {
			w, fl := qw[i], float32(L[i])
			slx := sumlx - float32(w*v*fl)
			sl2 := suml2 - float32(w*fl*fl)
			if !(slx > 0 && sl2 > 0) {
				continue
			}
			nl := min(nmax, NearestInt(v*sl2/slx))
			if nl == int32(L[i]) {
				continue
			}
			fn := float32(nl)
			slx += float32(w * v * fn)
			sl2 += float32(w * fn * fn)
			if slx*slx*suml2 > sumlx*sumlx*sl2 {
				L[i], sumlx, suml2 = uint8(nl), slx, sl2
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	return sumlx, suml2
}

// squaredError is Σ qw_i·(x_i − scale·l(i))² in ggml's float32 order.
func squaredError(x, qw []float32, scale float32, l func(i int) float32) float32 {
	var sum float32
	for i, v := range x {
		d := v - float32(scale*l(i))
		sum += float32(qw[i] * d * d)
	}
	return sum
}

// FitSymmetric is ggml's make_qx_quants with rmse_type 1 (fitSymmetric), for ggml's other
// types that use it (Q4_0 and Q5_0 with an importance matrix): codes in L, the scale returned.
func FitSymmetric(nmax int32, x []float32, L []uint8, qw []float32) float32 {
	return fitSymmetric(nmax, x, L, qw)
}
