package packing

import (
	"fmt"

	"github.com/qpack-dev/qpack/quant"
)

// GPTQ is the AutoGPTQ/GPTQModel layout (formats.md §1). For a module prefix P and W[N, K]:
//
//	P.qweight I32 [K·b/32, N]     codes packed along K, column n a dense bitstream (PackStream)
//	P.qzeros  I32 [ng, ⌈N·b/32⌉]  zero points packed along N, one bitstream per group
//	P.scales  F16 [ng, N]
//	P.g_idx   I32 [K]             group of each input channel (k / G without act-order)
//
// ng = ⌈K/G⌉ (1 for per-channel, written as group_size −1 in the config). K·b must be a
// multiple of 32 (K a multiple of 32/b, or of 32 for 3-bit).
//
// V2 false is checkpoint_format "gptq": the stored zero is (z − 1) mod 2^b, and readers add 1
// back. AutoGPTQ's own reader masks the sum to b bits, so z = 0 survives; vLLM's and ExLlama's
// v1 kernels do not mask and read it as 2^b — use V2 for asymmetric checkpoints meant for
// them. V2 true is "gptq_v2": the stored zero is z.
type GPTQ struct{ V2 bool }

func (f GPTQ) Name() string {
	if f.V2 {
		return "gptq_v2"
	}
	return "gptq"
}

func (f GPTQ) Supports(s quant.Scheme) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if s.Grid != quant.Integer {
		return fmt.Errorf("format %s holds integer 2/3/4/8-bit schemes, not %s: use format qpack", f.Name(), s)
	}
	return nil
}

// zeroShift is what the stored zero point is below the true one.
func (f GPTQ) zeroShift() int {
	if f.V2 {
		return 0
	}
	return 1
}

func (f GPTQ) checkShape(prefix string, s quant.Scheme, k int) error {
	if k*s.Bits%32 != 0 {
		return fmt.Errorf("tensor %s: format %s packs %d-bit codes along K in whole int32 words, so K must be a multiple of %d, not %d",
			prefix, f.Name(), s.Bits, 32/gcd(32, s.Bits), k)
	}
	return nil
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func (f GPTQ) Pack(prefix string, t *quant.Tensor) ([]Raw, error) {
	if err := checkTensor(prefix, t); err != nil {
		return nil, err
	}
	s, n, k := t.Scheme, t.N, t.K
	if err := f.Supports(s); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	if err := f.checkShape(prefix, s, k); err != nil {
		return nil, err
	}
	ng := s.Groups(k)
	rows := k * s.Bits / 32
	qweight := make([]uint32, rows*n)
	// 32 codes fill exactly b words, so each column's stream can be cut into blocks of 32
	// codes; going block by block over all columns reads and writes memory nearly in order.
	for k0 := 0; k0 < k; k0 += 32 {
		r0, count := k0*s.Bits/32, min(32, k-k0)
		for c := range n {
			if err := PackStream(qweight[r0*n+c:], n, t.Codes[c*k+k0:], 1, count, s.Bits); err != nil {
				return nil, fmt.Errorf("tensor %s, output row %d, input channels from %d: %w", prefix, c, k0, err)
			}
		}
	}
	zw := PackedLen[uint32](n, s.Bits)
	qzeros := make([]uint32, ng*zw)
	stored := make([]uint8, n)
	for g := range ng {
		for c := range n {
			stored[c] = uint8((int(t.Zeros[c*ng+g]) - f.zeroShift()) & s.MaxQ())
		}
		if err := PackStream(qzeros[g*zw:], 1, stored, 1, n, s.Bits); err != nil {
			return nil, fmt.Errorf("tensor %s zeros: %w", prefix, err)
		}
	}
	scales, err := f16Raw(prefix+".scales", t.Scales, transposed(n, ng), ng, n)
	if err != nil {
		return nil, err
	}
	gidx := t.GIdx
	if gidx == nil {
		gidx = plainGIdx(t)
	}
	return []Raw{
		wordsRaw(prefix+".qweight", qweight, rows, n),
		wordsRaw(prefix+".qzeros", qzeros, ng, zw),
		scales,
		int32sRaw(prefix+".g_idx", gidx),
	}, nil
}

func (f GPTQ) Metadata(string, *quant.Tensor) map[string]string { return nil }

func (f GPTQ) Unpack(prefix string, get func(string) (Raw, bool), meta map[string]string) (*quant.Tensor, error) {
	s, err := schemeFor(prefix, meta)
	if err != nil {
		return nil, err
	}
	if err := f.Supports(s); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	g := getter(get)
	qw, err := g.need(prefix + ".qweight")
	if err != nil {
		return nil, err
	}
	rows, n, err := qw.matrix("I32")
	if err != nil {
		return nil, err
	}
	k := rows * 32 / s.Bits
	if rows*32%s.Bits != 0 {
		return nil, fmt.Errorf("tensor %s: %d rows of words do not hold whole %d-bit codes", qw.Name, rows, s.Bits)
	}
	var gidx []int32
	if gr, ok := get(prefix + ".g_idx"); ok { // old AutoGPTQ checkpoints may lack it
		gr.Name = prefix + ".g_idx"
		if err := gr.expect("I32", k); err != nil {
			return nil, fmt.Errorf("%w (qweight holds K = %d %d-bit codes)", err, k, s.Bits)
		}
		gidx = rawInt32s(gr)
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
	zw := PackedLen[uint32](n, s.Bits)
	if err := qz.expect("I32", ng, zw); err != nil {
		return nil, err
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k),
		Scales: make([]float32, n*ng), Zeros: make([]uint8, n*ng)}
	words := rawWords(qw)
	for k0 := 0; k0 < k; k0 += 32 { // in blocks of 32 codes, as Pack
		r0, count := k0*s.Bits/32, min(32, k-k0)
		for c := range n {
			if err := UnpackStream(t.Codes[c*k+k0:], 1, words[r0*n+c:], n, count, s.Bits); err != nil {
				return nil, err
			}
		}
	}
	zwords := rawWords(qz)
	for gi := range ng {
		if err := UnpackStream(t.Zeros[gi:], ng, zwords[gi*zw:], 1, n, s.Bits); err != nil {
			return nil, err
		}
	}
	for i, z := range t.Zeros {
		t.Zeros[i] = uint8((int(z) + f.zeroShift()) & s.MaxQ())
		if s.Sym && int(t.Zeros[i]) != symZero(s) {
			return nil, fmt.Errorf("tensor %s: symmetric scheme %s but zero point %d for row %d group %d", qz.Name, s, t.Zeros[i], i/ng, i%ng)
		}
	}
	rawF16(sc, t.Scales, transposed(ng, n))
	if gidx != nil && !trivialGIdx(s, gidx) {
		if err := checkGIdx(prefix+".g_idx", gidx, k, ng); err != nil {
			return nil, err
		}
		t.GIdx = gidx
	}
	return t, nil
}

func (f GPTQ) Bytes(s quant.Scheme, n, k int) int64 {
	ng := int64(s.Groups(k))
	return int64(k*s.Bits/32)*int64(n)*4 + ng*int64(PackedLen[uint32](n, s.Bits))*4 + ng*int64(n)*2 + int64(k)*4
}

func (f GPTQ) TensorNames(prefix string) []string {
	return []string{prefix + ".qweight", prefix + ".qzeros", prefix + ".scales", prefix + ".g_idx"}
}
