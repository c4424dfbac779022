package blockwise

import (
	"fmt"
	"runtime"

	"github.com/qpack-dev/qpack/internal/shares"
	"github.com/qpack-dev/qpack/quant"
)

// quantizeFP8Blocks quantizes W[n, k] to block FP8 (quant.FP8Block, B×B blocks): each block's
// scale is its absmax/448 (quant.FP8Scale: 1 for an all-zero block), each code E4M3(w/scale),
// saturating. Runs of bands of B rows go to GOMAXPROCS goroutines; each band is read twice, for
// the block maxima and then to encode. A non-finite weight is reported at the lowest row.
func quantizeFP8Blocks(dst *quant.Tensor, src rowSource, n, k int, s quant.Scheme) error {
	b, groups := s.GroupSize, s.Groups(k)
	resize(dst, n, k, s, true)
	dst.GlobalScale = 0
	bands := (n + b - 1) / b
	return shares.Runs(bands, min(runtime.GOMAXPROCS(0), bands), func(lo, hi int) error {
		buf, amax := make([]float32, k), make([]float32, groups)
		for band := lo; band < hi; band++ {
			if err := quantizeFP8Band(dst, src, band*b, min((band+1)*b, n), buf, amax); err != nil {
				return err
			}
		}
		return nil
	})
}

// quantizeFP8Band quantizes rows r0 … r1−1, one band of blocks; buf (len K) and amax (one per
// column block) are scratch.
func quantizeFP8Band(dst *quant.Tensor, src rowSource, r0, r1 int, buf, amax []float32) error {
	k, b, groups := dst.K, dst.Scheme.GroupSize, len(amax)
	clear(amax)
	for row := r0; row < r1; row++ {
		w := src.segment(row, 0, k, buf)
		for g := range groups {
			r := minMax(w[g*b : min((g+1)*b, k)])
			if !r.finite() {
				col := g*b + firstNonFinite(w[g*b:min((g+1)*b, k)])
				return fmt.Errorf("weight at row %d, column %d is %g", row, col, w[col])
			}
			amax[g] = max(amax[g], r.absMax())
		}
	}
	for g := range amax {
		amax[g] = quant.FP8Scale(amax[g]) // the block's scale from here on
	}
	for row := r0; row < r1; row++ {
		w := src.segment(row, 0, k, buf)
		copy(dst.Scales[row*groups:(row+1)*groups], amax)
		codes := dst.Codes[row*k : (row+1)*k]
		for c, v := range w {
			codes[c] = quant.FP8Code(v, amax[c/b])
		}
	}
	return nil
}
