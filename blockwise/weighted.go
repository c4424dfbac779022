package blockwise

import (
	"math"

	"github.com/qpack-dev/qpack/quant"
)

// The importance-weighted scale search (Options.Imatrix), llama.cpp's imatrix idea on qpack's
// grids: per group, the parameters that minimise Σ imp_k·(w_k − ŵ_k)², imp_k the importance of
// input channel k (calibration E[x²], or diag H inside GPTQ; 1 without importance). Candidates
// are the min-max fit of the range shrunk by p = 1 − i/50 (i = 0..39, down to 0.22), for an
// asymmetric integer grid also with only its low or only its high end shrunk; each candidate's
// codes are then refitted by weighted least squares (refitter) and re-encoded once. The first
// candidate with the smallest error wins, so plain RTN is kept unless something is strictly
// better.
const (
	weightedSteps = 40
	weightedGrid  = 50
)

// refitter is a grid whose parameters have a closed-form weighted least-squares fit given codes.
type refitter interface {
	refit(w, imp []float32, codes []uint8, pr params, r span) (params, bool)
}

// weightedSearch returns the best parameters for group w of span r; codes (len(w)) is scratch.
func weightedSearch(q groupQuantizer, w []float32, r span, imp []float32, codes []uint8) params {
	best := q.fit(w, r, 1)
	bestErr := math.Inf(1)
	// try evaluates a candidate, leaving its codes in codes; it reports false for a scale the
	// format cannot hold.
	try := func(pr params) bool {
		if !finite(pr.scale) || pr.scale <= 0 {
			return false
		}
		if err := groupError(q, w, imp, pr, codes, bestErr, 2); err < bestErr {
			best, bestErr = pr, err
		}
		return true
	}
	rf, canRefit := q.(refitter)
	asym := false
	if iq, ok := q.(intQuantizer); ok {
		asym = !iq.s.Sym
	}
	for i := range weightedSteps {
		p := float32(1 - float64(i)/weightedGrid)
		all := [3]span{{p * r.lo, p * r.hi}, {p * r.lo, r.hi}, {r.lo, p * r.hi}}
		spans := all[:1]
		if asym && i > 0 {
			spans = all[:]
		}
		for _, s := range spans {
			pr := q.fit(w, s, 1)
			if !try(pr) || !canRefit {
				continue
			}
			if rp, ok := rf.refit(w, imp, codes, pr, r); ok {
				try(rp)
			}
		}
	}
	return best
}

// weightOf is imp[i], or 1 without importance.
func weightOf(imp []float32, i int) float64 {
	if imp == nil {
		return 1
	}
	return float64(imp[i])
}

// refit solves, for the codes q_k, min Σ imp_k (w_k − a·q_k − b)² over a and b (asymmetric) or
// min Σ imp_k (w_k − a·(q_k − z))² with z = 2^(bits−1) (symmetric); the asymmetric zero is then
// z = round(−b/a) clamped to the grid and a is solved again with that z. The scale is rounded
// to F16 as the format stores it.
func (q intQuantizer) refit(w, imp []float32, codes []uint8, pr params, r span) (params, bool) {
	zero := pr.zero
	if !q.s.Sym {
		var sv, sq, sqq, sw, sqw float64
		for i, v := range w {
			c, x := weightOf(imp, i), float64(codes[i])
			sv += c
			sq += c * x
			sqq += c * x * x
			sw += c * float64(v)
			sqw += c * x * float64(v)
		}
		det := sv*sqq - sq*sq
		if det <= 0 {
			return params{}, false
		}
		a := (sv*sqw - sq*sw) / det
		b := (sqq*sw - sq*sqw) / det
		if !(a > 0) {
			return params{}, false
		}
		zero = uint8(min(max(math.RoundToEven(-b/a), 0), float64(q.s.MaxQ())))
	}
	var num, den float64
	for i, v := range w {
		c, x := weightOf(imp, i), float64(int(codes[i])-int(zero))
		num += c * x * float64(v)
		den += c * x * x
	}
	if !(den > 0) || !(num > 0) {
		return params{}, false
	}
	scale := quant.RoundF16(float32(num / den))
	if scale == 0 {
		return params{}, false
	}
	return params{scale: scale, zero: zero, small: r.absMax() < scale*(1<<20)}, true
}

// refit solves min Σ imp_k (w_k − a·nf4[q_k])² over a, rounded to F16.
func (nf4Quantizer) refit(w, imp []float32, codes []uint8, _ params, _ span) (params, bool) {
	var num, den float64
	for i, v := range w {
		c, x := weightOf(imp, i), float64(quant.NF4Values[codes[i]])
		num += c * x * float64(v)
		den += c * x * x
	}
	if !(den > 0) || !(num > 0) {
		return params{}, false
	}
	scale := quant.RoundF16(float32(num / den))
	if scale == 0 {
		return params{}, false
	}
	return params{scale: scale}, true
}
