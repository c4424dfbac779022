package packing

import (
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
	for r := range k {
		if err := PackAWQ4(qweight[r*cols:], t.Codes[r:], k, n); err != nil {
			return nil, fmt.Errorf("tensor %s, input channel %d: %w", prefix, r, err)
		}
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
	words := rawWords(qw)
	for r := range k {
		if err := UnpackAWQ4(t.Codes[r:], k, words[r*cols:], n); err != nil {
			return nil, err
		}
	}
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
