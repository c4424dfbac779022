package packing

import (
	"encoding/binary"
	"fmt"

	"github.com/qpack-dev/qpack/quant"
)

// AWQ is AutoAWQ's GEMM layout (docs/reference/formats.md §2.1), 4-bit asymmetric only. For W[N, K]:
//
//	P.qweight I32 [K, N/8]   codes packed along N with the AWQOrder interleave (PackAWQ4)
//	P.qzeros  I32 [K/G, N/8] zero points z (no offset), packed the same way
//	P.scales  F16 [K/G, N]
//
// There is no g_idx (no act-order). K must be a multiple of G and N of 8.
type AWQ struct{}

func (AWQ) MixedSchemes() bool { return false }

func (AWQ) Name() string { return "awq" }

func (AWQ) Supports(s quant.Scheme) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := refuseKQuant("awq", s); err != nil {
		return err
	}
	if s.Grid != quant.Integer || s.Bits != 4 || s.Sym {
		return fmt.Errorf("format awq holds int4 asymmetric schemes only, not %s: use format gptq or compressed-tensors (or qpack)", s)
	}
	return nil
}

func (f AWQ) checkShape(prefix string, s quant.Scheme, n, k int) error {
	if n%8 != 0 {
		return fmt.Errorf("tensor %s: format awq packs 8 output channels per word, N = %d is not a multiple of 8", prefix, n)
	}
	if s.GroupSize != quant.PerChannel && k%s.GroupSize != 0 {
		return fmt.Errorf("tensor %s: format awq needs K (%d) to be a multiple of the group size %d", prefix, k, s.GroupSize)
	}
	return nil
}

func (f AWQ) Pack(prefix string, t *quant.Tensor) ([]Raw, error) {
	if err := checkTensor(prefix, t); err != nil {
		return nil, err
	}
	s, n, k := t.Scheme, t.N, t.K
	if err := f.Supports(s); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	if t.GIdx != nil && !trivialGIdx(s, t.GIdx) {
		return nil, fmt.Errorf("tensor %s: format awq has no g_idx, so it cannot hold act-order groups: use format gptq", prefix)
	}
	if err := f.checkShape(prefix, s, n, k); err != nil {
		return nil, err
	}
	ng := s.Groups(k)
	cols := n / 8
	qweight := make([]uint32, k*cols)
	if err := packAWQWeights(qweight, t.Codes, n, k); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	qzeros := make([]uint32, ng*cols)
	for g := range ng {
		if err := PackAWQ4(qzeros[g*cols:], t.Zeros[g:], ng, n); err != nil {
			return nil, fmt.Errorf("tensor %s zeros: %w", prefix, err)
		}
	}
	scales, err := f16Raw(prefix+".scales", t.Scales, transposed(n, ng), ng, n)
	if err != nil {
		return nil, err
	}
	return []Raw{
		wordsRaw(prefix+".qweight", qweight, k, cols),
		wordsRaw(prefix+".qzeros", qzeros, ng, cols),
		scales,
	}, nil
}

func (AWQ) Metadata(string, *quant.Tensor) map[string]string { return nil }

func (f AWQ) Unpack(prefix string, get func(string) (Raw, bool), meta map[string]string) (*quant.Tensor, error) {
	s, err := supportedScheme(f, prefix, meta)
	if err != nil {
		return nil, err
	}
	g := getter(get)
	qw, err := g.need(prefix + ".qweight")
	if err != nil {
		return nil, err
	}
	k, cols, err := qw.matrix("I32")
	if err != nil {
		return nil, err
	}
	n := 8 * cols
	if err := f.checkShape(prefix, s, n, k); err != nil {
		return nil, err
	}
	ng := s.Groups(k)
	sc, err := g.need(prefix + ".scales")
	if err != nil {
		return nil, err
	}
	if err := sc.expect("F16", ng, n); err != nil {
		return nil, err
	}
	qz, err := g.need(prefix + ".qzeros")
	if err != nil {
		return nil, err
	}
	if err := qz.expect("I32", ng, cols); err != nil {
		return nil, err
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k),
		Scales: make([]float32, n*ng), Zeros: make([]uint8, n*ng)}
	unpackAWQWeights(t.Codes, rawWords(qw), n, k)
	zwords := rawWords(qz)
	for gi := range ng {
		if err := UnpackAWQ4(t.Zeros[gi:], ng, zwords[gi*cols:], n); err != nil {
			return nil, err
		}
	}
	rawF16(sc, t.Scales, transposed(ng, n))
	return checkUnpacked(prefix, t)
}

func (AWQ) Bytes(s quant.Scheme, n, k int) int64 {
	ng := int64(s.Groups(k))
	return int64(k)*int64(n/8)*4 + ng*int64(n/8)*4 + ng*int64(n)*2
}

func (AWQ) TensorNames(prefix string) []string {
	return []string{prefix + ".qweight", prefix + ".qzeros", prefix + ".scales"}
}

// packAWQWeights writes qweight [K, N/8] from the n×k codes, a block of eight output rows (one
// word column) at a time over goroutines (eachRows): each block's eight rows are read eight input
// channels at a time, one uint64 per row, and the eight words of those channels made from them
// (AWQOrder's nibble pairs are byte j of x[0]|x[2]<<4, x[4]|x[6]<<4, x[1]|x[3]<<4 and x[5]|x[7]<<4)
// instead of gathering every code from its row, k bytes apart. A code that does not fit in 4 bits
// is an error (checkTensor refuses such tensors first).
func packAWQWeights(qweight []uint32, codes []uint8, n, k int) error {
	cols := n / 8
	return eachRows(cols, 8*k, func(c0, c1 int) error {
		for c := c0; c < c1; c++ {
			rows := codes[8*c*k : 8*(c+1)*k]
			r := 0
			for ; r+8 <= k; r += 8 {
				var x [8]uint64
				var seen uint64
				for j := range x {
					x[j] = binary.LittleEndian.Uint64(rows[j*k+r:])
					seen |= x[j]
				}
				if seen&0xF0F0F0F0F0F0F0F0 != 0 {
					return fmt.Errorf("a code of output rows %d–%d, input channels %d–%d does not fit in 4 bits", 8*c, 8*c+7, r, r+7)
				}
				p := [4]uint64{x[0] | x[2]<<4, x[4] | x[6]<<4, x[1] | x[3]<<4, x[5] | x[7]<<4}
				for i := range uint(8) {
					qweight[(r+int(i))*cols+c] = uint32(p[0]>>(8*i)&0xFF) | uint32(p[1]>>(8*i)&0xFF)<<8 |
						uint32(p[2]>>(8*i)&0xFF)<<16 | uint32(p[3]>>(8*i)&0xFF)<<24
				}
			}
			for ; r < k; r++ {
				if err := PackAWQ4(qweight[r*cols+c:r*cols+c+1], rows[r:], k, 8); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// unpackAWQWeights is packAWQWeights in reverse: the eight words of eight input channels of a
// word column become one uint64 per output row, written whole.
func unpackAWQWeights(codes []uint8, qweight []uint32, n, k int) {
	cols := n / 8
	eachRows(cols, 8*k, func(c0, c1 int) error {
		const low = 0x0F0F0F0F0F0F0F0F
		for c := c0; c < c1; c++ {
			rows := codes[8*c*k : 8*(c+1)*k]
			r := 0
			for ; r+8 <= k; r += 8 {
				var p [4]uint64
				for i := range uint(8) {
					w := uint64(qweight[(r+int(i))*cols+c])
					p[0] |= (w & 0xFF) << (8 * i)
					p[1] |= (w >> 8 & 0xFF) << (8 * i)
					p[2] |= (w >> 16 & 0xFF) << (8 * i)
					p[3] |= (w >> 24 & 0xFF) << (8 * i)
				}
				for j, x := range [8]uint64{p[0] & low, p[2] & low, p[0] >> 4 & low, p[2] >> 4 & low,
					p[1] & low, p[3] & low, p[1] >> 4 & low, p[3] >> 4 & low} {
					binary.LittleEndian.PutUint64(rows[j*k+r:], x)
				}
			}
			for ; r < k; r++ {
				UnpackAWQ4(rows[r:], k, qweight[r*cols+c:r*cols+c+1], 8) // eight codes: no error
			}
		}
		return nil
	})
}
