package blockwise

import (
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// rowQuantizer quantizes row `row` of dst, reading its weights from src through buf; codes
// (len K) receive its codes.
type rowQuantizer func(dst *quant.Tensor, src rowSource, row int, codes []uint8, buf []float32) error

// rowQuantizerFor returns how rows of scheme s are quantized and the buffer length it needs:
// group by group (quantizeRow), or for k-quants and IQ types the whole row, block by block.
func rowQuantizerFor(s quant.Scheme, k int, opt Options) (rowQuantizer, int) {
	if kt, err := kquant.TypeOf(s); err == nil {
		return blockRow(kt, opt.Importance), k
	}
	if it, err := iquant.TypeOf(s); err == nil {
		return blockRow(it, opt.Importance), k
	}
	if quantize := rtnIntRows(s, k, opt); quantize != nil {
		return quantize, groupLen(s, k)
	}
	q := quantizerFor(s, opt.GlobalScale)
	return func(dst *quant.Tensor, src rowSource, row int, codes []uint8, buf []float32) error {
		return quantizeRow(dst, q, src, row, codes, buf, opt)
	}, groupLen(s, k)
}

// rowFitter fits a whole row of a k-quant (kquant.Type) or IQ (iquant.Type) tensor.
type rowFitter interface {
	QuantizeRow(q *quant.Tensor, n int, w, imp []float32) error
}

// blockRow fits each block of a row with ggml's fitting (kquant.Type.Fit, iquant.Type.Fit):
// the imatrix variant when importance is given (Options.Imatrix with Importance), else ggml's
// plain one, which already searches each sub-block's scales.
func blockRow(f rowFitter, imp []float32) rowQuantizer {
	return func(dst *quant.Tensor, src rowSource, row int, _ []uint8, buf []float32) error {
		w := src.segment(row, 0, dst.K, buf)
		if col := firstNonFinite(w); col >= 0 {
			return fmt.Errorf("weight at row %d, column %d is %g", row, col, w[col])
		}
		if err := f.QuantizeRow(dst, row, w, imp); err != nil {
			return fmt.Errorf("row %d, %w", row, err)
		}
		return nil
	}
}

// Takes says whether round-to-nearest with opt quantizes to scheme s at all, whatever the
// tensor: k-quants and IQ types have no clipping search (their fit chooses each sub-block's
// range itself), ggml fits iq2_xxs, iq2_xs and iq1_s only with an importance matrix, block
// FP8 has no search at all (each block's scale is its absmax/448), and only NVFP4 takes a
// global scale (a finite positive one).
func Takes(s quant.Scheme, opt Options) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("blockwise: %w", err)
	}
	_, kq := s.KQuant()
	f, iq := s.IQuant()
	switch {
	case (kq || iq) && opt.Clip:
		return fmt.Errorf("blockwise: %s has no clipping search (--clip); its fit searches each sub-block's scale itself, with importance under --imatrix", s)
	case iq && f.Imatrix && !opt.Imatrix:
		return fmt.Errorf("blockwise: %s needs an importance matrix: ggml refuses to quantize it without one (use --imatrix)", s)
	case s.Grid == quant.FP8Block && (opt.Clip || opt.Imatrix || opt.Params != nil):
		return fmt.Errorf("blockwise: %s scales each block by its absmax/448; it has no clipping or imatrix search (--clip, --imatrix)", s)
	}
	if g := opt.GlobalScale; g != 0 && (s.Grid != quant.NVFP4 || !(g > 0) || math.IsInf(float64(g), 0)) {
		return fmt.Errorf("blockwise: global scale %g given for %s (NVFP4 takes a finite positive one, other grids none)", g, s)
	}
	return nil
}

// checkRowLength is Takes for rows of k weights: k-quants also need rows of whole sub-blocks,
// IQ types and FP4 whole blocks.
func checkRowLength(k int, s quant.Scheme, opt Options) error {
	if err := Takes(s, opt); err != nil {
		return err
	}
	if err := s.CheckRowLength(k); err != nil {
		return fmt.Errorf("blockwise: %w", err)
	}
	return nil
}
