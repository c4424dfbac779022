package iquant

import (
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// The IQ1 fits: ggml's quantize_row_iq1_s_impl and quantize_row_iq1_m_impl. A group of 8
// weights is a point of a ternary grid (coordinates −1, 0, 1) shifted by δ = ±1/8. Each
// sub-block's scale, levels and shift are found exactly for the unconstrained problem: with
// the weights sorted, every split into three runs (levels 0, 1, 2) is scored by its weighted
// least-squares fit; groups whose levels are off the grid then take the nearest neighbour.

// iq1Eps are ggml's GROUP_MAX_EPS_IQ1_S and GROUP_MAX_EPS_IQ1_M.
var iq1Eps = map[quant.IQType]float32{quant.IQ1S: 1e-12, quant.IQ1M: 1e-7}

// iq1Values are the values of levels 0, 1, 2 for δ = +1/8 (xp) and −1/8 (xm).
var iq1Values = [2][3]float32{{-1 + quant.IQ1Delta, quant.IQ1Delta, 1 + quant.IQ1Delta}, {-1 - quant.IQ1Delta, -quant.IQ1Delta, 1 - quant.IQ1Delta}}

// iq1Fit is the scratch of one IQ1 block's fit.
type iq1Fit struct {
	t      *Type
	lat    *lattice
	weight [32]float32
	idx    [32]int // weight indices in increasing order of x
	L      [32]int8
}

// fitIQ1 fits a block of iq1_s (sub-blocks of 32, one δ each) or iq1_m (sub-blocks of 16, a δ
// per group of 8) into p.
func fitIQ1(t *Type, c *carry, x, imp []float32, p *Params) error {
	f := iq1Fit{t: t, lat: t.lat()}
	var sumx2 float32
	for _, v := range x {
		sumx2 += float32(v * v)
	}
	sigma2 := float32(2*sumx2) / quant.SuperBlock
	var scales [16]float32
	var maxScale float32
	for ib := range t.Block / t.Sub {
		xb := x[ib*t.Sub : (ib+1)*t.Sub]
		f.weights(xb, imp, ib, sigma2)
		max := abs32(xb[0])
		for _, v := range xb[1:] {
			max = cmax(max, abs32(v))
		}
		if max < iq1Eps[t.Type] {
			continue // ggml leaves the sub-block's shift as the last block left it
		}
		scale, shift, err := f.subBlock(xb, p, ib)
		if err != nil {
			return err
		}
		scales[ib], c.shifts[ib] = scale, shift
		maxScale = cmax(maxScale, scale)
	}
	if maxScale == 0 {
		return nil
	}
	d := maxScale / 15
	id := 1 / d
	for ib := range t.Block / t.Sub {
		p.Scales[ib] = int8(clampInt(kquant.NearestInt(float32(0.5*float32(float32(id*scales[ib])-1))), 0, 7))
	}
	if t.Type == quant.IQ1S {
		for ib := range 8 {
			if c.shifts[ib] == -1 {
				p.Signs[ib] = 1
			}
		}
		p.D = quant.RoundF16(d * 1.125)
		return nil
	}
	return f.refitIQ1M(x, imp, sigma2, c, p, d)
}

// weights fills f.weight for sub-block ib: qw·√(σ² + x²), or x² without importance.
func (f *iq1Fit) weights(xb, imp []float32, ib int, sigma2 float32) {
	for i, v := range xb {
		if imp != nil {
			f.weight[i] = imp[ib*f.t.Sub+i] * sqrt32(sigma2+float32(v*v))
		} else {
			f.weight[i] = v * v
		}
	}
}

// subBlock fits sub-block ib and stores its grid points in p. It returns the scale and the
// shift: iq1_s ±1 (δ = ±1/8), iq1_m 0 … 3 (bit 1 set: the first group's δ is −1/8, bit 0: the
// second's).
func (f *iq1Fit) subBlock(xb []float32, p *Params, ib int) (float32, int8, error) {
	n := len(xb)
	for i := range n {
		f.idx[i] = i
	}
	for i := 1; i < n; i++ { // a stable insertion sort by x (ggml's qsort is a stable merge sort here)
		v, j := f.idx[i], i-1
		for ; j >= 0 && xb[f.idx[j]] > xb[v]; j-- {
			f.idx[j+1] = f.idx[j]
		}
		f.idx[j+1] = v
	}
	var scale float32
	var i1, i2, shift int
	if f.t.Type == quant.IQ1S {
		scale, i1, i2, shift = f.splitS(xb)
	} else {
		scale, i1, i2, shift = f.splitM(xb)
	}
	if i1 < 0 {
		return 0, 0, ggmlAborts("no split of a sub-block has a positive fit")
	}
	for j, i := range f.idx[:n] {
		f.L[i] = level(j, i1, i2)
	}
	if scale < 0 {
		for i := range n {
			f.L[i] = 2 - f.L[i]
		}
		scale = -scale
		shift = flipShift(f.t.Type, shift)
	}
	allOnGrid := true
	for g := range n / 8 {
		lg := f.L[8*g : 8*g+8]
		pt := f.lat.onGrid(lg)
		if pt < 0 {
			allOnGrid = false
			if pt = f.nearest(lg, xb[8*g:8*g+8], f.weight[8*g:8*g+8], scale, f.values(shift, g)); pt < 0 {
				return 0, 0, ggmlAborts("no IQ1 grid point near levels %v at scale %g", lg, scale)
			}
		}
		p.Points[ib*n/8+g] = uint16(pt)
	}
	if !allOnGrid {
		var sumqx, sumq2 float32
		for g := range n / 8 {
			xx := f.values(shift, g)
			for j, l := range f.lat.point(int(p.Points[ib*n/8+g])) {
				w, q := f.weight[8*g+j], xx[l]
				sumqx += float32(float32(w*q) * xb[8*g+j])
				sumq2 += float32(float32(w*q) * q)
			}
		}
		if sumqx > 0 && sumq2 > 0 {
			scale = sumqx / sumq2
		}
	}
	if !(scale >= 0) {
		return 0, 0, ggmlAborts("a sub-block's scale is %g", scale)
	}
	return scale, int8(shift), nil
}

// flipShift is the shift after every level l became 2 − l and the scale −scale.
func flipShift(t quant.IQType, shift int) int {
	if t == quant.IQ1S {
		return -shift
	}
	return 3 - shift
}

// values are the level values of group g under shift.
func (f *iq1Fit) values(shift, g int) *[3]float32 {
	neg := shift == -1
	if f.t.Type == quant.IQ1M {
		neg = shift>>(1-g)&1 == 1
	}
	if neg {
		return &iq1Values[1]
	}
	return &iq1Values[0]
}

// splitS is iq1_s's exhaustive search over the splits i1 ≤ i2 of the sorted weights, with
// prefix sums, for δ = +1/8 then −1/8: the best scale, split and shift (i1 = −1: none). The
// terms of the first and last runs depend on one end of the split only and are computed once.
func (f *iq1Fit) splitS(xb []float32) (scale float32, bi1, bi2, bshift int) {
	n := len(xb)
	var sumx, sumw [33]float32
	for j, i := range f.idx[:n] {
		sumx[j+1] = sumx[j] + float32(f.weight[i]*xb[i])
		sumw[j+1] = sumw[j] + f.weight[i]
	}
	// first[s][i1] and last[s][i2]: the runs' products for δ choice s, as ggml rounds them
	var first, firstW, last, lastW [2][33]float32
	for s, xx := range iq1Values {
		for i := 0; i <= n; i++ {
			first[s][i] = float32((sumx[i] - sumx[0]) * xx[0])
			firstW[s][i] = float32(float32((sumw[i]-sumw[0])*xx[0]) * xx[0])
			last[s][i] = float32((sumx[n] - sumx[i]) * xx[2])
			lastW[s][i] = float32(float32((sumw[n]-sumw[i])*xx[2]) * xx[2])
		}
	}
	best := -minFloat32
	scale, bi1, bi2 = max32(xb), -1, -1
	for i1 := 0; i1 <= n; i1++ {
		for i2 := i1; i2 <= n; i2++ {
			bx, bw := sumx[i2]-sumx[i1], sumw[i2]-sumw[i1]
			for s := range 2 {
				x1 := iq1Values[s][1]
				sumqx := float32(first[s][i1]+float32(bx*x1)) + last[s][i2]
				sumq2 := float32(firstW[s][i1]+float32(float32(bw*x1)*x1)) + lastW[s][i2]
				if sumq2 > 0 && sumqx*sumqx > best*sumq2 {
					scale = sumqx / sumq2
					best = scale * sumqx
					bi1, bi2, bshift = i1, i2, 1-2*s
				}
			}
		}
	}
	return scale, bi1, bi2, bshift
}

// splitM is iq1_m's search: for every split, the sums of the four shift combinations (each
// group of 8 with δ = ±1/8) accumulated from scratch in ggml's order. The products each weight
// adds for each level and δ are the same for every split, so they are computed once.
func (f *iq1Fit) splitM(xb []float32) (scale float32, bi1, bi2, bk int) {
	n := len(xb)
	// terms[j][l] holds, for the weight at sorted position j at level l: w·xp·x, w·xm·x,
	// w·xp·xp, w·xm·xm, and whether it lies in the second group of 8.
	var terms [16][3][4]float32
	var second [16]bool
	for j, i := range f.idx[:n] {
		w, x := f.weight[i], xb[i]
		second[j] = i >= n/2
		for l := range 3 {
			p, m := iq1Values[0][l], iq1Values[1][l]
			terms[j][l] = [4]float32{float32(float32(w*p) * x), float32(float32(w*m) * x), float32(float32(w*p) * p), float32(float32(w*m) * m)}
		}
	}
	best := -minFloat32
	scale, bi1, bi2, bk = max32(xb), -1, -1, -1
	// The sums run over j in order, so the part before i1 (level 0) is shared by every i2 and
	// the part before i2 (levels 0 and 1) grows by one term per i2: only the terms from i2 on
	// are added anew, and every sum is still ggml's sequence of additions.
	var head sums4
	for i1 := 0; i1 <= n; i1++ {
		mid := head
		for i2 := i1; i2 <= n; i2++ {
			all := mid
			for j := i2; j < n; j++ {
				all.add(&terms[j][2], second[j])
			}
			for k := range 4 {
				if all.q2[k] > 0 && all.qx[k]*all.qx[k] > best*all.q2[k] {
					scale = all.qx[k] / all.q2[k]
					best = scale * all.qx[k]
					bi1, bi2, bk = i1, i2, k
				}
			}
			if i2 < n {
				mid.add(&terms[i2][1], second[i2])
			}
		}
		if i1 < n {
			head.add(&terms[i1][0], second[i1])
		}
	}
	return scale, bi1, bi2, bk
}

// sums4 are the four shift combinations' Σ w·q·x and Σ w·q² (combination k: bit 1 chooses the
// first group's δ, set for −1/8, bit 0 the second's).
type sums4 struct{ qx, q2 [4]float32 }

// add adds one weight's terms (w·xp·x, w·xm·x, w·xp², w·xm²) to the combinations it is in.
func (s *sums4) add(t *[4]float32, second bool) {
	px, mx, pq, mq := t[0], t[1], t[2], t[3]
	if second {
		s.qx[0], s.qx[1], s.qx[2], s.qx[3] = s.qx[0]+px, s.qx[1]+mx, s.qx[2]+px, s.qx[3]+mx
		s.q2[0], s.q2[1], s.q2[2], s.q2[3] = s.q2[0]+pq, s.q2[1]+mq, s.q2[2]+pq, s.q2[3]+mq
		return
	}
	s.qx[0], s.qx[1], s.qx[2], s.qx[3] = s.qx[0]+px, s.qx[1]+px, s.qx[2]+mx, s.qx[3]+mx
	s.q2[0], s.q2[1], s.q2[2], s.q2[3] = s.q2[0]+pq, s.q2[1]+pq, s.q2[2]+mq, s.q2[3]+mq
}

// refitIQ1M stores iq1_m's shifts and its block scale: the least-squares d of every weight's
// value (level value)·(2·sc + 1) over the block (the max-scale d if nothing is weighted),
// stored as d·1.1125.
func (f *iq1Fit) refitIQ1M(x, imp []float32, sigma2 float32, c *carry, p *Params, d float32) error {
	var sumqx, sumq2 float32
	for ib := range 16 {
		shift := int(c.shifts[ib])
		p.Signs[2*ib], p.Signs[2*ib+1] = uint8(shift>>1&1), uint8(shift&1)
		xb := x[16*ib : 16*ib+16]
		f.weights(xb, imp, ib, sigma2)
		m := float32(2*int(p.Scales[ib]) + 1)
		for g := range 2 {
			xx := f.values(shift, g)
			for j, l := range f.lat.point(int(p.Points[2*ib+g])) {
				w, q := f.weight[8*g+j], float32(xx[l]*m)
				sumqx += float32(float32(w*q) * xb[8*g+j])
				sumq2 += float32(float32(w*q) * q)
			}
		}
	}
	if sumq2 > 0 {
		d = sumqx / sumq2
	}
	p.D = quant.RoundF16(d * 1.1125)
	return nil
}

// nearest is ggml's iq1_find_best_neighbour2 for the off-grid levels L of a group with weights x
// and w: among their neighbours the point minimising Σ w_i·(scale·xx[l_i] − x_i)², the first on
// ties. It writes the point's levels to L and returns it, or −1 (ggml aborts).
func (f *iq1Fit) nearest(L []int8, x, w []float32, scale float32, xx *[3]float32) int {
	lat := f.lat
	start := -1 - int(lat.kmap[lat.index(L)])
	sv := [3]float32{scale * xx[0], scale * xx[1], scale * xx[2]}
	xs, ws := (*[8]float32)(x), (*[8]float32)(w)
	best, bestD2 := -1, maxFloat32
	for _, pt := range lat.neighbours[start+1 : start+1+int(lat.neighbours[start])] {
		levels := (*[8]int8)(lat.levels[int(pt)*8:])
		var d2 float32
		for i := range 8 {
			diff := sv[levels[i]] - xs[i]
			d2 += float32(float32(ws[i]*diff) * diff)
		}
		if d2 < bestD2 {
			best, bestD2 = int(pt), d2
		}
	}
	if best >= 0 {
		copy(L, lat.point(best))
	}
	return best
}

// level is the level of the weight at sorted position j under the split i1 ≤ i2.
func level(j, i1, i2 int) int8 {
	switch {
	case j < i1:
		return 0
	case j < i2:
		return 1
	}
	return 2
}

// max32 is ggml's starting scale, the largest |x|.
func max32(x []float32) float32 {
	m := abs32(x[0])
	for _, v := range x[1:] {
		m = cmax(m, abs32(v))
	}
	return m
}

const minFloat32 float32 = 0x1p-126 // FLT_MIN
