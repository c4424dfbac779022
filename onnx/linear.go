package onnx

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// Ops says which operators hold a quantized linear.
type Ops string

const (
	// MatMulNBits is onnxruntime's com.microsoft.MatMulNBits (2, 4 and 8 bits).
	MatMulNBits Ops = "matmulnbits"
	// QDQ is the standard blocked DequantizeLinear (opset 21; 2-bit needs 25) feeding MatMul.
	QDQ Ops = "qdq"
)

// containerBits is the code width the ONNX ops store a scheme's codes in: 3-bit codes fit
// 4-bit containers and 5- to 7-bit codes 8-bit ones, exactly (their zero points are stored too).
func containerBits(s quant.Scheme) int {
	switch {
	case s.Bits == 3:
		return 4
	case s.Bits > 4 && s.Bits < 8:
		return 8
	}
	return s.Bits
}

// Supports returns nil when ops can hold scheme s exactly, else an error naming the nearest
// scheme that can.
func (ops Ops) Supports(s quant.Scheme) error {
	group := "pc"
	if s.GroupSize != quant.PerChannel {
		group = fmt.Sprintf("g%d", s.GroupSize)
	}
	var nearest string
	why := "MatMulNBits and DequantizeLinear take integer codes"
	switch s.Grid {
	case quant.Integer:
		if ops == MatMulNBits && s.GroupSize != quant.PerChannel && nbitsBlock(s.GroupSize) == 0 {
			return fmt.Errorf("%s: MatMulNBits blocks are 16, 32, 64, 128 or 256 columns and cannot hold groups of %d; use --onnx-ops qdq or a group size that is a multiple of 16",
				s, s.GroupSize)
		}
		return nil
	case quant.NF4:
		nearest = "int4-" + group + "-asym"
	case quant.FP8E4M3, quant.FP8Block:
		nearest = "int8-pc-sym"
	case quant.NVFP4, quant.MXFP4:
		why = "MatMulNBits and DequantizeLinear here take integer codes with float scales; FP4 codes with E4M3/E8M0 block scales are not written"
		nearest = "int4-" + group + "-sym"
	case quant.Binary:
		nearest = "int2-" + group + "-asym"
	case quant.KQuant:
		why = "MatMulNBits and DequantizeLinear take one float scale per block, not sub-block scales quantized against an F16 super-block scale"
		nearest = fmt.Sprintf("int%d-%s-%s", s.Bits, group, map[bool]string{true: "sym", false: "asym"}[s.Sym])
	case quant.IQuant:
		why = "MatMulNBits and DequantizeLinear take integer codes, not lattice points or non-uniform values"
		nearest = fmt.Sprintf("int%d-%s-sym", max(2, s.Bits), group)
	}
	return fmt.Errorf("%s has no ONNX weight-only operator (%s); the nearest scheme that exports is %s (qpack convert --scheme %s), or export with --dequantize-unsupported to write it dequantized",
		s, why, nearest, nearest)
}

// nbitsBlock is the largest MatMulNBits block size (a power of two from 16 to 256) that divides
// group, 0 when none does.
func nbitsBlock(group int) int {
	for bs := 256; bs >= 16; bs /= 2 {
		if group%bs == 0 {
			return bs
		}
	}
	return 0
}

// layout is how a quantized tensor's columns map onto the ONNX blocks.
type layout struct {
	t     *quant.Tensor
	bits  int     // container bits
	bs    int     // block size along K
	kb    int     // blocks per row
	perm  []int64 // column order (act-order), nil for the stored order
	group int     // columns per group in the (permuted) order; 0: one group per row
}

// newLayout checks that t's groups are contiguous blocks once its columns are sorted by group
// (what GPTQ's act-order produces), and picks the block size: the group size for DQ, a power of
// two dividing it for MatMulNBits (each group's parameters repeated over its blocks).
func newLayout(prefix string, t *quant.Tensor, ops Ops) (*layout, error) {
	l := &layout{t: t, bits: containerBits(t.Scheme)}
	if t.Scheme.Groups(t.K) > 1 {
		l.group = t.Scheme.GroupSize
	}
	if t.GIdx != nil {
		order := make([]int64, t.K)
		for k := range order {
			order[k] = int64(k)
		}
		sort.SliceStable(order, func(a, b int) bool { return t.GIdx[order[a]] < t.GIdx[order[b]] })
		trivial := true
		for k, c := range order {
			want := 0
			if l.group > 0 {
				want = k / l.group
			}
			if int(t.GIdx[c]) != want {
				return nil, fmt.Errorf("tensor %s: its g_idx does not sort into groups of %d columns, which ONNX blocks need; export with --dequantize-unsupported", prefix, l.group)
			}
			trivial = trivial && c == int64(k)
		}
		if !trivial {
			l.perm = order
		}
	}
	switch {
	case ops == QDQ && l.group > 0:
		l.bs = l.group
	case ops == QDQ:
		l.bs = t.K
	case l.group > 0:
		l.bs = nbitsBlock(l.group)
	default: // one group per row: any block size, the parameters repeated
		l.bs = 16
		for l.bs < 128 && l.bs < t.K {
			l.bs *= 2
		}
	}
	if l.bs == 0 {
		return nil, fmt.Errorf("tensor %s: %w", prefix, ops.Supports(t.Scheme))
	}
	l.kb = (t.K + l.bs - 1) / l.bs
	return l, nil
}

// code returns the code of row n at column k of the (permuted) order.
func (l *layout) code(n, k int) uint8 {
	if l.perm != nil {
		k = int(l.perm[k])
	}
	return l.t.Codes[n*l.t.K+k]
}

// param returns the index into Scales/Zeros of row n at block b.
func (l *layout) param(n, b int) int {
	g := 0
	if l.group > 0 {
		g = b * l.bs / l.group
	}
	return n*l.t.Scheme.Groups(l.t.K) + g
}

// hasZeros reports whether any zero point differs from the container's default 2^(bits−1),
// which both MatMulNBits (no zero_points input) and signed DQ (no x_zero_point) imply.
func (l *layout) hasZeros() bool {
	def := uint8(1 << (l.bits - 1))
	return slices.ContainsFunc(l.t.Zeros, func(z uint8) bool { return z != def })
}

// packBits packs values LSB-first, bits each, into a byte slice of ceil(len·bits/8) bytes.
func packBits(dst []byte, i, bits int, v uint8) {
	pos := i * bits
	dst[pos/8] |= (v & uint8(1<<bits-1)) << (pos % 8)
}

// gather puts the act-order column permutation in front of a linear: Gather(x, perm, axis=-1).
func (e *exporter) gather(x, prefix string, l *layout) (string, error) {
	if l.perm == nil {
		return x, nil
	}
	raw := make([]byte, 8*len(l.perm))
	for i, p := range l.perm {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(p))
	}
	perm, err := e.g.Init(prefix+".perm", Int64, []int64{int64(len(l.perm))}, raw)
	if err != nil {
		return "", err
	}
	return e.g.Op("Gather", []string{x, perm}, IntAttr("axis", -1)), nil
}

// matMulNBits writes y = x·Wᵀ + bias as com.microsoft.MatMulNBits: B [N, kb, bs·bits/8] holds
// row n's codes LSB-first along K (padded to whole blocks), scales [N, kb], and packed uint8
// zero points [N, ceil(kb·bits/8)] unless every zero is the default.
func (e *exporter) matMulNBits(x, prefix string, l *layout, bias string) (string, error) {
	t := l.t
	blob := l.bs * l.bits / 8
	b := make([]byte, t.N*l.kb*blob)
	for n := range t.N {
		row := b[n*l.kb*blob : (n+1)*l.kb*blob]
		for k := range t.K {
			packBits(row, k, l.bits, l.code(n, k))
		}
	}
	bName, err := e.g.Init(prefix+".qweight", Uint8, []int64{int64(t.N), int64(l.kb), int64(blob)}, b)
	if err != nil {
		return "", err
	}
	scales := make([]float32, t.N*l.kb)
	zpRow := (l.kb*l.bits + 7) / 8
	zp := make([]byte, t.N*zpRow)
	for n := range t.N {
		for j := range l.kb {
			scales[n*l.kb+j] = t.Scales[l.param(n, j)]
			packBits(zp[n*zpRow:], j, l.bits, t.Zeros[l.param(n, j)])
		}
	}
	sName, err := e.g.Float32s(prefix+".scales", scales, int64(t.N), int64(l.kb))
	if err != nil {
		return "", err
	}
	zName := ""
	if l.hasZeros() {
		if zName, err = e.g.Init(prefix+".zero_points", Uint8, []int64{int64(t.N), int64(zpRow)}, zp); err != nil {
			return "", err
		}
	}
	if x, err = e.gather(x, prefix, l); err != nil {
		return "", err
	}
	inputs := []string{x, bName, sName, zName, "", bias}
	if bias == "" {
		inputs = inputs[:4]
	}
	out := e.g.name("MatMulNBits")
	e.g.OpTo("MatMulNBits", "com.microsoft", inputs, []string{out},
		IntAttr("K", int64(t.K)), IntAttr("N", int64(t.N)), IntAttr("bits", int64(l.bits)), IntAttr("block_size", int64(l.bs)))
	e.usesMS = true
	return out, nil
}

// qdq writes y = x·DequantizeLinear(codes)ᵀ-free: the weight as B [K, N] codes of a signed type
// (symmetric: code − 2^(bits−1), no zero point) or an unsigned one with zero points, blocked
// along K (axis 0), scales [kb, N], then MatMul and the bias.
func (e *exporter) qdq(x, prefix string, l *layout, bias string) (string, error) {
	t := l.t
	signed := !l.hasZeros()
	dtype := map[int][2]int32{2: {Uint2, Int2}, 4: {Uint4, Int4}, 8: {Uint8, Int8}}[l.bits]
	typ := dtype[0]
	if signed {
		typ = dtype[1]
	}
	if l.bits == 2 {
		e.needOpset(25)
	}
	def := 1 << (l.bits - 1)
	codes := make([]byte, (t.K*t.N*l.bits+7)/8)
	for n := range t.N {
		for k := range t.K {
			v := int(l.code(n, k))
			if signed {
				v -= def // two's complement in the low bits
			}
			packBits(codes, k*t.N+n, l.bits, uint8(v))
		}
	}
	wName, err := e.g.Init(prefix+".qweight", typ, []int64{int64(t.K), int64(t.N)}, codes)
	if err != nil {
		return "", err
	}
	scales := make([]float32, l.kb*t.N)
	zp := make([]byte, (l.kb*t.N*l.bits+7)/8)
	for j := range l.kb {
		for n := range t.N {
			scales[j*t.N+n] = t.Scales[l.param(n, j)]
			packBits(zp, j*t.N+n, l.bits, t.Zeros[l.param(n, j)])
		}
	}
	sName, err := e.g.Float32s(prefix+".scales", scales, int64(l.kb), int64(t.N))
	if err != nil {
		return "", err
	}
	inputs := []string{wName, sName}
	if !signed {
		zName, err := e.g.Init(prefix+".zero_points", typ, []int64{int64(l.kb), int64(t.N)}, zp)
		if err != nil {
			return "", err
		}
		inputs = append(inputs, zName)
	}
	w := e.g.Op("DequantizeLinear", inputs, IntAttr("axis", 0), IntAttr("block_size", int64(l.bs)))
	if x, err = e.gather(x, prefix, l); err != nil {
		return "", err
	}
	y := e.g.Op("MatMul", []string{x, w})
	if bias != "" {
		y = e.g.Op("Add", []string{y, bias})
	}
	return y, nil
}

// floatWeight writes a float weight W [N, K] as its transpose [K, N] (see floatInit).
func (e *exporter) floatWeight(name string, w []float32, n, k int) (string, error) {
	wt := make([]float32, n*k)
	for r := range n {
		for c, v := range w[r*k : (r+1)*k] {
			wt[c*n+r] = v
		}
	}
	return e.floatInit(name, wt, int64(k), int64(n))
}

// floatInit writes float values in the narrowest of float16, bfloat16 and float32 that holds
// every one of them exactly (a BF16 checkpoint stays 2 bytes a weight), so the export is exact
// either way; a narrow initializer is cast to float32 (once, when the session loads). It
// returns a FLOAT value.
func (e *exporter) floatInit(name string, v []float32, dims ...int64) (string, error) {
	f16, bf16 := true, true
	for _, x := range v {
		f16 = f16 && fp.F16ToF32(fp.F32ToF16(x)) == x && !math.IsInf(float64(x), 0)
		bf16 = bf16 && fp.BF16ToF32(fp.F32ToBF16(x)) == x
		if !f16 && !bf16 {
			return e.g.Float32s(name, v, dims...)
		}
	}
	raw := make([]byte, 2*len(v))
	dtype := int32(Float16)
	for i, x := range v {
		if f16 {
			binary.LittleEndian.PutUint16(raw[2*i:], fp.F32ToF16(x))
		} else {
			dtype = BFloat16
			binary.LittleEndian.PutUint16(raw[2*i:], fp.F32ToBF16(x))
		}
	}
	h, err := e.g.Init(name, dtype, dims, raw)
	if err != nil {
		return "", err
	}
	return e.g.Op("Cast", []string{h}, IntAttr("to", Float)), nil
}
