package blockwise

import "github.com/qpack-dev/qpack/quant"

// useRTNKernel lets the tests compare the kernel with the reference on the same machine.
var useRTNKernel = hasRTNKernel

// rtnIntRows returns the row quantizer of plain round-to-nearest on the integer grid (no clip
// or imatrix search, no given parameters) that runs the whole groups of BF16 rows on the
// rtnIntGroupsAVX2 kernel, or nil where it does not apply (no kernel, groups not a multiple of
// 8 weights). Rows from other sources take quantizeRow.
func rtnIntRows(s quant.Scheme, k int, opt Options) rowQuantizer {
	gs := groupLen(s, k)
	if !useRTNKernel || s.Grid != quant.Integer || opt.Clip || opt.Imatrix || opt.Params != nil || gs%8 != 0 {
		return nil
	}
	q := intQuantizer{s}
	symZero := int32(0)
	if s.Sym {
		symZero = int32(s.MaxQ()+1) / 2
	}
	return func(dst *quant.Tensor, src rowSource, row int, codes []uint8, buf []float32) error {
		bf, ok := src.(bf16Rows)
		if !ok {
			return quantizeRow(dst, q, src, row, codes, buf, opt)
		}
		groups := s.Groups(k)
		whole := k / gs
		first := row * groups
		rtnIntGroupsAVX2(&codes[0], &dst.Scales[first], &dst.Zeros[first], &bf.raw[2*row*k], whole, gs, int32(s.MaxQ()), symZero, float32(s.MaxQ()))
		for g := range groups {
			// The kernel leaves scale 0 where it found a NaN, an infinity or an F16 overflow;
			// the reference reports them. A partial last group is the reference's too.
			if g == whole || dst.Scales[first+g] == 0 {
				if err := quantizeGroup(dst, q, src, row, g, codes, buf, opt); err != nil {
					return err
				}
			}
		}
		return nil
	}
}
