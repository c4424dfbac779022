package packing

import (
	"fmt"

	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/quant"
)

// packIQuant stores an IQ tensor as its shape and its rows of ggml blocks (iquant.AppendRows):
// every field of a block is a quant.Tensor field, and the blocks are the densest layout there is.
func (QPack) packIQuant(prefix string, t *quant.Tensor) ([]Raw, error) {
	blocks, err := iquant.AppendRows(nil, t)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	return []Raw{shapeRaw(prefix+".qpack_shape", t.N, t.K),
		{Name: prefix + ".qpack_blocks", DType: "U8", Shape: []int{t.N, len(blocks) / t.N}, Data: blocks}}, nil
}

// unpackIQuant reads an IQ module back (see QPack), checking the blocks' dtype and shape against
// [N, K] before decoding them.
func (QPack) unpackIQuant(g getter, prefix string, s quant.Scheme, n, k int) (*quant.Tensor, error) {
	f, _ := s.IQuant()
	if k%f.Block != 0 {
		return nil, fmt.Errorf("tensor %s: K = %d is not a multiple of %s's block of %d", prefix, k, s, f.Block)
	}
	r, err := g.need(prefix + ".qpack_blocks")
	if err != nil {
		return nil, err
	}
	if err := r.expect("U8", n, k/f.Block*f.BlockBytes); err != nil {
		return nil, err
	}
	for _, extra := range []string{".qpack_codes", ".qpack_scales", ".qpack_g_idx"} {
		if _, ok := g(prefix + extra); ok {
			return nil, fmt.Errorf("tensor %s: %s is stored as ggml blocks, but %s%s is stored too", prefix, s, prefix, extra)
		}
	}
	t, err := iquant.Decode(s, r.Data, n, k)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	return t, nil
}

// iquantBytes is what packIQuant stores for an n×k IQ weight: ggml's size.
func iquantBytes(s quant.Scheme, n, k int) int64 {
	f, _ := s.IQuant()
	return 16 + int64(n)*int64(k/f.Block*f.BlockBytes)
}
