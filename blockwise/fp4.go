package blockwise

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/internal/shares"
	"github.com/qpack-dev/qpack/quant"
)

// nvfp4Quantizer: block scale s = E4M3(global·p·absmax/6) (quant.NVFP4BlockScale), code =
// E2M1(w/(s/global)) with both divisions in float32.
type nvfp4Quantizer struct{ global float32 }

func (q nvfp4Quantizer) fit(_ []float32, r span, p float32) params {
	return params{scale: quant.NVFP4BlockScale(p*r.absMax(), q.global)}
}

func (q nvfp4Quantizer) encode(codes []uint8, w []float32, pr params) {
	encodeFP4(codes, w, pr.scale/q.global)
}

func (q nvfp4Quantizer) decode(c uint8, pr params) float32 {
	return quant.FP4Values[c&15] * (pr.scale / q.global)
}

// nearbyScales are the E4M3 values from 20 steps below the fitted block scale (under a fifth
// of it, as far as the clip search's shrinking goes) to 3 above.
func (q nvfp4Quantizer) nearbyScales(fitted params) []params {
	b0, _ := quant.E4M3Byte(fitted.scale)
	var out []params
	for b := max(int(b0)-20, 1); b <= min(int(b0)+3, 0x7e); b++ {
		out = append(out, params{scale: fp.E4M3ToF32(uint8(b))})
	}
	return out
}

// mxfp4Quantizer: block scale 2^(⌊log2(p·absmax)⌋ − 2) (quant.MXFP4Scale), code = E2M1(w/scale).
type mxfp4Quantizer struct{}

func (mxfp4Quantizer) fit(_ []float32, r span, p float32) params {
	return params{scale: quant.MXFP4Scale(p * r.absMax())}
}

func (mxfp4Quantizer) encode(codes []uint8, w []float32, pr params) { encodeFP4(codes, w, pr.scale) }

func (mxfp4Quantizer) decode(c uint8, pr params) float32 { return quant.FP4Values[c&15] * pr.scale }

// nearbyScales are the powers of two from an eighth of the fitted block scale to twice it:
// below, more of the block saturates at ±6; above, nothing does (its largest value then lies in
// [2, 4)·scale).
func (mxfp4Quantizer) nearbyScales(fitted params) []params {
	e0, _ := quant.E8M0Byte(fitted.scale)
	var out []params
	for e := max(int(e0)-3, 0); e <= min(int(e0)+1, 254); e++ {
		out = append(out, params{scale: quant.E8M0Value(uint8(e))})
	}
	return out
}

// encodeFP4 writes E2M1(w/f) for each weight: the nearest E2M1 value, ties to even, saturating
// at ±6, the sign kept (fp.F32ToE2M1).
func encodeFP4(codes []uint8, w []float32, f float32) {
	codes = codes[:len(w)]
	for i, v := range w {
		codes[i] = fp.F32ToE2M1(v / f)
	}
}

// scaleEnumerator is a grid whose block scale takes few values: the weighted search tries
// the representable scales near the plain fit's (nearbyScales) instead of shrunk ranges.
type scaleEnumerator interface {
	nearbyScales(fitted params) []params
}

// scaleSearch is the imatrix search of a grid with few block scales: the plain fit first, then
// every nearby scale, keeping the first with the smallest Σ imp·(w − ŵ)².
func scaleSearch(q groupQuantizer, se scaleEnumerator, w []float32, r span, imp []float32, codes []uint8) params {
	best := q.fit(w, r, 1)
	bestErr := groupError(q, w, imp, best, codes, math.Inf(1), 2)
	for _, pr := range se.nearbyScales(best) {
		if err := groupError(q, w, imp, pr, codes, bestErr, 2); err < bestErr {
			best, bestErr = pr, err
		}
	}
	return best
}

// tensorAbsMax returns the largest |w| of W[n, k], scanning rows on GOMAXPROCS goroutines; a
// NaN or infinite weight is an error naming the first one.
func tensorAbsMax(src rowSource, n, k int) (float32, error) {
	var mu sync.Mutex
	var amax float32
	err := shares.Runs(n, min(runtime.GOMAXPROCS(0), n, max(1, n*k/(1<<16))), func(lo, hi int) error {
		buf := make([]float32, k)
		var m float32
		for row := lo; row < hi; row++ {
			_, r := src.spanned(row, 0, k, buf)
			if !r.finite() {
				return rowError(src, row, 0, k, buf, fmt.Errorf("row %d is not finite", row))
			}
			m = max(m, r.absMax())
		}
		mu.Lock()
		defer mu.Unlock()
		amax = max(amax, m)
		return nil
	})
	return amax, err
}
