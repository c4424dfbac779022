package awq

import (
	"fmt"
	"math"
)

// ClipResult is the outcome of SearchClip.
type ClipResult struct {
	Err, Err0 float64 // mean squared group-wise output error with the chosen clipping, and without
	Clipped   int     // (row, group) pairs whose range was shrunk
}

// SearchClip searches, per output row and input group of l (already scaled), the largest
// |w| kept: max = absmax·(1 − i/ClipGrid) for i = 0 .. MaxShrink·ClipGrid − 1, clamping the
// group to [−max, max] before fake quantization, minimising the mean over sampled tokens of the
// group's partial dot-product error (Σ_group x·w − Σ_group x·Q(w))². It clamps l.W to the best
// range in place. x [rows, K] are the scaled inputs; every stride-th row is used, at most
// ClipTokens of them.
func SearchClip(x []float32, rows int, l Linear, opt Options) (ClipResult, error) {
	n, k := l.Out, l.In
	if l.Scheme == nil {
		return ClipResult{}, fmt.Errorf("awq: %s: clipping search of a linear that is not quantized", l.Name)
	}
	gs := l.Scheme.GroupSize
	if gs <= 0 || gs > k {
		gs = k
	}
	groups := (k + gs - 1) / gs
	xs, t := sampleRows(x, rows, k, opt.clipTokens())
	absmax := groupAbsMax(l.W, n, k, gs)
	grid, steps := opt.clipSteps()
	best := make([]float64, n*groups)
	bestMax := make([]float32, n*groups)
	for i := range best {
		best[i] = math.Inf(1)
	}
	var res ClipResult
	wc := make([]float32, n*k)
	errs := make([]float64, n*groups)
	gl := newGroupLosses(xs, t, n, k, gs)
	for step := range steps {
		shrink := float32(1 - float64(step)/float64(grid))
		copy(wc, l.W)
		clampGroups(wc, n, k, gs, absmax, shrink)
		if err := fakeQuant(wc, n, k, *l.Scheme); err != nil {
			return res, fmt.Errorf("awq: %s: %w", l.Name, err)
		}
		for i := range wc {
			wc[i] = l.W[i] - wc[i]
		}
		gl.measure(errs, wc)
		for i, e := range errs {
			if step == 0 {
				res.Err0 += e
			}
			if e < best[i] {
				best[i], bestMax[i] = e, absmax[i]*shrink
			}
		}
	}
	for i, e := range best {
		res.Err += e
		if bestMax[i] < absmax[i] {
			res.Clipped++
		}
	}
	res.Err /= float64(n * groups)
	res.Err0 /= float64(n * groups)
	clampGroups(l.W, n, k, gs, bestMax, 1)
	return res, nil
}

// sampleRows keeps every stride-th of rows rows so that at most limit remain.
func sampleRows(x []float32, rows, k, limit int) ([]float32, int) {
	stride := max(rows/limit, 1)
	if stride == 1 && rows <= limit {
		return x[:rows*k], rows
	}
	var out []float32
	t := 0
	for r := 0; r < rows && t < limit; r += stride {
		out = append(out, x[r*k:(r+1)*k]...)
		t++
	}
	return out, t
}

// groupAbsMax is max |w| per row and group.
func groupAbsMax(w []float32, n, k, gs int) []float32 {
	groups := (k + gs - 1) / gs
	m := make([]float32, n*groups)
	for r := range n {
		for c, v := range w[r*k : (r+1)*k] {
			i := r*groups + c/gs
			m[i] = max(m[i], float32(math.Abs(float64(v))))
		}
	}
	return m
}

// clampGroups clamps each row's group to ±limit·shrink.
func clampGroups(w []float32, n, k, gs int, limit []float32, shrink float32) {
	groups := (k + gs - 1) / gs
	parallelRows(n, k, func(r0, r1 int) {
		for r := r0; r < r1; r++ {
			row := w[r*k : (r+1)*k]
			for c := range row {
				m := limit[r*groups+c/gs] * shrink
				row[c] = min(max(row[c], -m), m)
			}
		}
	})
}

// groupLosses measures, per output row and input group, the mean over the sampled tokens of
// the group's squared partial dot-product error: one outputLoss per group of columns, its
// Gram matrix (or gathered inputs) formed once for all the clipping steps.
type groupLosses struct {
	n, k, gs, t int
	groups      []*outputLoss
	dg          []float32
	row         []float64
}

func newGroupLosses(x []float32, t, n, k, gs int) *groupLosses {
	gl := &groupLosses{n: n, k: k, gs: gs, t: t, row: make([]float64, n)}
	for c0 := 0; c0 < k; c0 += gs {
		w := min(gs, k-c0)
		xg := make([]float32, t*w)
		for r := range t {
			copy(xg[r*w:(r+1)*w], x[r*k+c0:r*k+c0+w])
		}
		gl.groups = append(gl.groups, newOutputLoss(xg, t, w))
	}
	return gl
}

// measure sets errs[r, g] = mean over the tokens of (Σ_{c∈g} x[t,c]·d[r,c])².
func (gl *groupLosses) measure(errs []float64, d []float32) {
	groups := len(gl.groups)
	for g, out := range gl.groups {
		c0 := g * gl.gs
		w := min(gl.gs, gl.k-c0)
		gl.dg = grow(gl.dg, gl.n*w)
		for r := range gl.n {
			copy(gl.dg[r*w:(r+1)*w], d[r*gl.k+c0:r*gl.k+c0+w])
		}
		out.perRow(gl.row, gl.dg, gl.n)
		for r, e := range gl.row {
			errs[r*groups+g] = e / float64(max(gl.t, 1))
		}
	}
}
