package iquant

import (
	"math"

	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// The IQ2 and IQ3 fits: ggml's quantize_row_iq2_xxs_impl, _iq2_xs_impl, _iq2_s_impl,
// _iq3_xxs_impl and _iq3_s_impl. Each sub-block of Sub weights is fitted alone: signs are split
// off (x = s·|x|), then a search over inverse scales rounds |x| to levels l (values 2l+1),
// looks the levels up on the grid and, off the grid, takes the nearest of their neighbours;
// the scale with the best weighted least-squares fit wins, and groups found off the grid are
// rounded again with it. The block then stores d = max scale/31 (times a fudge factor) and each
// sub-block's scale as a 4-bit multiple of d. The five differ in the knobs below.

// knobs are where the five quantizers differ.
type knobs struct {
	maxQ        int     // levels 0 … maxQ−1 (ggml's kMaxQ)
	sigmaFactor float32 // σ² = factor·Σx²/256 over the block
	eps         float32 // sub-blocks with max |x| below this are zero (iq3_s: only exactly 0)
	steps       int     // inverse scales (2·maxQ − 1 + is·step)/max for is = −steps … steps
	step        float32
	fudge       float32 // d is stored as (max scale/31)·fudge (1: none)
	// qpStart (iq2_xxs): the search starts from make_qp_quants' scale, its inverse scales are
	// taken over maxQ·that scale, and every group is rounded again with the winning scale.
	qpStart bool
	// onGridStart is the on-grid state of every group before any inverse scale is accepted:
	// true, false (iq3_s), or carried over from the last sub-block (iq3_xxs does not reset it).
	onGridStart onGridStart
	// requantizeAll (iq3_s) rounds every group again, not only those found off the grid.
	requantizeAll bool
	// defaultWeight is the weight of x without importance (nil: importance required).
	defaultWeight func(x, sigma2 float32) float32
}

type onGridStart int

const (
	startOnGrid onGridStart = iota
	startOffGrid
	startCarried
)

var knobsOf = map[quant.IQType]knobs{
	quant.IQ2XXS: {maxQ: 3, sigmaFactor: 1, eps: 1e-15, steps: 6, step: 0.1, fudge: 1, qpStart: true},
	quant.IQ2XS:  {maxQ: 3, sigmaFactor: 1, eps: 1e-15, steps: 9, step: 0.1, fudge: 1},
	quant.IQ2S: {maxQ: 3, sigmaFactor: 2, eps: 1e-8, steps: 9, step: 0.1, fudge: 0.9875,
		defaultWeight: func(x, sigma2 float32) float32 { return float32(0.25*sigma2) + float32(x*x) }},
	quant.IQ3XXS: {maxQ: 8, sigmaFactor: 2, eps: 1e-8, steps: 15, step: 0.2, fudge: 1.0125, onGridStart: startCarried,
		defaultWeight: square},
	quant.IQ3S: {maxQ: 8, sigmaFactor: 2, steps: 9, step: 0.2, fudge: 1.033, onGridStart: startOffGrid, requantizeAll: true,
		defaultWeight: square},
}

func square(x, _ float32) float32 { return x * x }

// latticeFit is the scratch of one block's fit.
type latticeFit struct {
	t                 *Type
	k                 knobs
	lat               *lattice
	weight            [32]float32
	waux              [32]float32 // √weight: the neighbour search's weights
	xval              [32]float32 // |x|, one per sign group possibly negated (parity)
	L                 [32]int8    // the levels kept
	Laux              [32]int8    // the levels of the inverse scale being tried
	onGrid, onGridAux [8]bool
	signs             [4]uint8
}

// fitLattice fits a block of an IQ2 or IQ3 type into p.
func fitLattice(t *Type, c *carry, x, imp []float32, p *Params) error {
	f := latticeFit{t: t, k: knobsOf[t.Type], lat: t.lat(), L: c.L, onGrid: c.onGrid}
	defer func() { c.L, c.onGrid = f.L, f.onGrid }()
	var sumx2 float32
	for _, v := range x {
		sumx2 += float32(v * v)
	}
	sigma2 := sumx2 / quant.SuperBlock
	if f.k.sigmaFactor != 1 {
		sigma2 = float32(f.k.sigmaFactor*sumx2) / quant.SuperBlock
	}
	var scales [16]float32
	var maxScale float32
	skipped := 0 // iq3_s: the sub-blocks skipped so far (see store)
	for ib := range t.Block / t.Sub {
		lo, hi := ib*t.Sub, (ib+1)*t.Sub
		var qw []float32
		if imp != nil {
			qw = imp[lo:hi]
		}
		scale, zero, err := f.subBlock(x[lo:hi], qw, sigma2)
		if err != nil {
			return err
		}
		if zero {
			if t.Type == quant.IQ3S {
				skipped++
			}
			continue
		}
		f.store(p, ib, skipped)
		scales[ib] = scale
		maxScale = cmax(maxScale, scale)
	}
	if maxScale == 0 {
		if t.Type != quant.IQ2S && t.Type != quant.IQ3S { // the others clear their block
			*p = Params{}
		}
		return nil
	}
	d := maxScale / 31
	p.D = quant.RoundF16(d * f.k.fudge)
	id := 1 / d
	for ib := range t.Block / t.Sub {
		p.Scales[ib] = int8(clampInt(kquant.NearestInt(float32(0.5*float32(float32(id*scales[ib])-1))), 0, 15))
	}
	return nil
}

// store writes the grid points and signs of sub-block ib. iq3_s (ggml's write position for
// points and signs does not advance past an all-zero sub-block, while the points' ninth bits
// go to the sub-block's own place) stores them skipped sub-blocks earlier.
func (f *latticeFit) store(p *Params, ib, skipped int) {
	t, lat := f.t, f.lat
	groups, signGroups := t.Sub/t.Dim, t.Sub/8
	for g := range groups {
		pt := uint16(lat.onGrid(f.L[g*t.Dim : (g+1)*t.Dim]))
		if t.Type == quant.IQ3S && skipped > 0 {
			own := ib*groups + g
			at := (ib-skipped)*groups + g
			p.Points[at] = p.Points[at]&0x100 | pt&0xff
			p.Points[own] = p.Points[own]&0xff | pt&0x100
			continue
		}
		p.Points[ib*groups+g] = pt
	}
	copy(p.Signs[(ib-skipped)*signGroups:], f.signs[:signGroups])
}

// subBlock fits the sub-block x (importance qw or nil) into f.L and f.signs, returning its
// scale, or zero for a sub-block ggml skips.
func (f *latticeFit) subBlock(x, qw []float32, sigma2 float32) (scale float32, zero bool, err error) {
	t, k := f.t, f.k
	n := len(x)
	for i, v := range x {
		if qw != nil {
			f.weight[i] = qw[i] * sqrt32(sigma2+float32(v*v))
		} else {
			f.weight[i] = k.defaultWeight(v, sigma2)
		}
		f.waux[i] = sqrt32(f.weight[i])
	}
	f.splitSigns(x)
	max := f.xval[0]
	for _, v := range f.xval[1:n] {
		max = cmax(max, v)
	}
	if max < k.eps || max == 0 {
		return 0, true, nil
	}
	if k.qpStart {
		scale, err = f.searchFromQP(n)
	} else {
		scale, err = f.search(n, max)
	}
	if err != nil {
		return 0, false, err
	}
	if scale < 0 { // ggml: "should never happen"; flip the scale and every sign
		scale = -scale
		for i := range f.signs {
			f.signs[i] = ^f.signs[i]
		}
	}
	for g := range n / t.Dim {
		if f.lat.onGrid(f.L[g*t.Dim:(g+1)*t.Dim]) < 0 {
			return 0, false, ggmlAborts("levels %v of a sub-block are not on the %s grid", f.L[g*t.Dim:(g+1)*t.Dim], t.Scheme)
		}
	}
	if !(scale >= 0) {
		return 0, false, ggmlAborts("a sub-block's scale is %g", scale)
	}
	return scale, false, nil
}

// splitSigns sets xval = |x| and the sign bytes; the parity types then flip back the least
// important weight (smallest weight·x²) of each 8 with an odd number of minus signs.
func (f *latticeFit) splitSigns(x []float32) {
	for g := range len(x) / 8 {
		var s uint8
		nflip := 0
		for i := g * 8; i < g*8+8; i++ {
			if x[i] >= 0 {
				f.xval[i] = x[i]
			} else {
				f.xval[i] = -x[i]
				s |= 1 << (i - g*8)
				nflip++
			}
		}
		if f.t.Parity && nflip%2 == 1 {
			imin, min := g*8, float32(f.weight[g*8]*x[g*8])*x[g*8]
			for i := g*8 + 1; i < g*8+8; i++ {
				if ax := float32(f.weight[i]*x[i]) * x[i]; ax < min {
					min, imin = ax, i
				}
			}
			f.xval[imin] = -f.xval[imin]
			s ^= 1 << (imin - g*8)
		}
		f.signs[g] = s
	}
}

// search is the inverse-scale search of iq2_xs, iq2_s, iq3_xxs and iq3_s, then the rounding of
// off-grid groups with the winning scale.
func (f *latticeFit) search(n int, max float32) (float32, error) {
	k := f.k
	if k.onGridStart != startCarried {
		for g := range n / f.t.Dim {
			f.onGrid[g] = k.onGridStart == startOnGrid
		}
	}
	scale, err := f.sweep(n, max, max/float32(2*k.maxQ-1))
	if err != nil {
		return 0, err
	}
	offGrid := false
	for g := range n / f.t.Dim {
		offGrid = offGrid || !f.onGrid[g]
	}
	if !offGrid || !(scale > 0) {
		return scale, nil
	}
	return f.requantize(n, scale, k.requantizeAll)
}

// searchFromQP is iq2_xxs's search: make_qp_quants' scale s, inverse scales over maxQ·s, then
// every group rounded again with the winning scale.
func (f *latticeFit) searchFromQP(n int) (float32, error) {
	k := f.k
	var L8 [32]uint8
	sumlx, suml2 := kquant.QPQuants(int32(k.maxQ+1), f.xval[:n], L8[:n], f.weight[:n])
	scale := sumlx / suml2
	for i := range n {
		f.L[i] = int8(L8[i])
	}
	scale, err := f.sweep(n, scale*float32(k.maxQ), scale)
	if err != nil || !(scale > 0) {
		return scale, err
	}
	return f.requantize(n, scale, true)
}

// sweep tries the inverse scales (2·maxQ − 1 + is·step)/ref for is = −steps … steps, keeping in
// f.L and f.onGrid the levels of the best weighted least-squares fit; it returns that fit's
// scale, or scale when none fits.
func (f *latticeFit) sweep(n int, ref, scale float32) (float32, error) {
	k := f.k
	best := float32(0)
	for is := -k.steps; is <= k.steps; is++ {
		id := (float32(2*k.maxQ-1) + float32(float32(is)*k.step)) / ref
		if err := f.round(f.Laux[:n], id, 1/id, f.onGridAux[:], true); err != nil {
			return 0, err
		}
		sumqx, sumq2 := f.sums(f.Laux[:n])
		if sumq2 > 0 && sumqx*sumqx > best*sumq2 {
			scale = sumqx / sumq2
			best = scale * sumqx
			copy(f.L[:n], f.Laux[:n])
			f.onGrid = f.onGridAux
		}
	}
	return scale, nil
}

// requantize rounds the groups again with scale (every group, or those found off the grid,
// leaving ggml's on-grid record as the sweep left it) and returns the least-squares scale of
// the result (scale when nothing is weighted).
func (f *latticeFit) requantize(n int, scale float32, all bool) (float32, error) {
	found := f.onGrid
	if err := f.round(f.L[:n], 1/scale, scale, found[:], all); err != nil {
		return 0, err
	}
	if sumqx, sumq2 := f.sums(f.L[:n]); sumq2 > 0 {
		scale = sumqx / sumq2
	}
	return scale, nil
}

// round rounds |x| of every group (or, unless all, of those not yet on the grid) to levels
// l = round((id·|x| − 1)/2) in [0, maxQ−1] into L, taking the nearest neighbour at scale
// `scale` for levels off the grid; onGrid records which groups were found on the grid.
func (f *latticeFit) round(L []int8, id, scale float32, onGrid []bool, all bool) error {
	lat, dim, top := f.lat, f.t.Dim, int32(f.k.maxQ-1)
	for g := range len(L) / dim {
		if !all && onGrid[g] {
			continue
		}
		lg, xs := L[g*dim:(g+1)*dim], f.xval[g*dim:(g+1)*dim]
		u := 0 // the levels' index, built as they are rounded (they are within the map's range)
		for i, x := range xs {
			l := clampInt(kquant.NearestInt(float32(0.5*float32(float32(id*x)-1))), 0, top)
			lg[i] = int8(l)
			u |= int(l) << (lat.shift * i)
		}
		p := lat.kmap[u]
		onGrid[g] = p >= 0
		if p < 0 && lat.nearestFrom(p, lg, xs, f.waux[g*dim:(g+1)*dim], scale) < 0 {
			return ggmlAborts("no grid point near levels %v at scale %g", lg, scale)
		}
	}
	return nil
}

// sums are Σ w·|x|·q and Σ w·q² with q = 2l+1.
func (f *latticeFit) sums(L []int8) (sumqx, sumq2 float32) {
	for i, l := range L {
		w, q := f.weight[i], float32(2*l+1)
		sumqx += float32(float32(w*f.xval[i]) * q)
		sumq2 += float32(float32(w*q) * q)
	}
	return sumqx, sumq2
}

func sqrt32(v float32) float32 { return float32(math.Sqrt(float64(v))) } // exact as sqrtf

// cmax is C's MAX(a, b): a > b ? a : b.
func cmax(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

func clampInt(l, lo, hi int32) int32 { return min(max(l, lo), hi) }

const maxFloat32 float32 = math.MaxFloat32
