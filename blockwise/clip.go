package blockwise

import "math"

// The clipping search of the GPTQ reference quantizer (quant.py, mse=True): try shrinking the
// group's range by p = 1 − i/100 for i = 0..79 and keep the candidate with the smallest
// Σ imp_k·|Q(w_k) − w_k|^2.4 (imp_k = 1 without importance). The first minimum wins, so p = 1,
// plain RTN, is kept unless a shrunk range is strictly better.
const (
	clipSteps = 80
	clipGrid  = 100
	clipNorm  = 2.4
)

// clipSearch returns the best parameters for group w of span r; codes (len(w)) is scratch. When
// no candidate's error is finite (weights so large that every scale overflows F16) it returns
// the unshrunk range's parameters, whose non-finite scale the caller reports.
func clipSearch(q groupQuantizer, w []float32, r span, imp []float32, codes []uint8) params {
	best := q.fit(w, r, 1)
	bestErr := math.Inf(1)
	for i := range clipSteps {
		p := float32(1 - float64(i)/clipGrid)
		pr := q.fit(w, r, p)
		if err := groupError(q, w, imp, pr, codes, bestErr, clipNorm); err < bestErr {
			best, bestErr = pr, err
		}
	}
	return best
}

// groupError returns Σ imp_k·|Q(w_k) − w_k|^norm in float64, or a partial sum ≥ limit as soon
// as the sum reaches limit (the terms are non-negative, so the candidate cannot win any more).
func groupError(q groupQuantizer, w, imp []float32, pr params, codes []uint8, limit, norm float64) float64 {
	q.encode(codes, w, pr)
	if _, ok := q.(intQuantizer); ok && norm == 2 {
		return intGroupError(w, imp, pr, codes, limit)
	}
	var sum float64
	for i, v := range w {
		d := math.Abs(float64(q.decode(codes[i], pr) - v))
		e := d * d
		if norm != 2 {
			e = math.Pow(d, norm)
		}
		if imp != nil {
			e *= float64(imp[i])
		}
		sum += e
		if sum >= limit {
			return sum
		}
	}
	return sum
}

// intGroupError is groupError's sum for the integer grid and norm 2 with the decoding written
// out (quant.DequantizeInt): the same terms in the same order, without a call per weight.
func intGroupError(w, imp []float32, pr params, codes []uint8, limit float64) float64 {
	codes = codes[:len(w)]
	zero := int(pr.zero)
	var sum float64
	if imp == nil {
		for i, v := range w {
			d := float64(pr.scale*float32(int(codes[i])-zero) - v)
			if sum += d * d; sum >= limit {
				return sum
			}
		}
		return sum
	}
	imp = imp[:len(w)]
	for i, v := range w {
		d := float64(pr.scale*float32(int(codes[i])-zero) - v)
		if sum += d * d * float64(imp[i]); sum >= limit {
			return sum
		}
	}
	return sum
}
