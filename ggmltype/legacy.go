package ggmltype

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// IsLegacy says whether s is one of ggml's 32-weight types (Q8_0, Q5_0, Q4_0), which qpack's
// round-to-nearest fits as ggml does (QuantizeLegacy) when it writes GGUF.
func IsLegacy(s quant.Scheme) bool {
	t, ok := TypeOf(s)
	return ok && (t == gguf.Q8_0 || t == gguf.Q5_0 || t == gguf.Q4_0)
}

// QuantizeLegacy fits an n×k weight to Q8_0, Q5_0 or Q4_0 as llama-quantize does (ggml's
// quantize_q8_0, quantize_q5_0, quantize_q4_0): the reference quantizers (quantize_row_*_ref)
// without importance, and for Q5_0 and Q4_0 with importance imp (E[x²] per column; Q8_0
// ignores it) make_qx_quants per block weighted by imp_j·√(σ² + x_j²), σ² the row's mean
// square. The tensor holds ggml's values: scale d (negative when the block's extreme weight
// is positive, as ggml stores it) and codes q with x ≈ d·(q − z).
func QuantizeLegacy(w []float32, n, k int, s quant.Scheme, imp []float32) (*quant.Tensor, error) {
	typ, ok := TypeOf(s)
	if !ok || !IsLegacy(s) {
		return nil, fmt.Errorf("%s is not one of ggml's Q8_0, Q5_0, Q4_0", s)
	}
	if err := Fits(typ, k); err != nil {
		return nil, err
	}
	if len(w) != n*k || (imp != nil && len(imp) != k) {
		return nil, fmt.Errorf("%d weights and %d importances for a %d×%d tensor", len(w), len(imp), n, k)
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k), Scales: make([]float32, n*k/32), Zeros: make([]uint8, n*k/32)}
	zero := uint8(1) << (s.Bits - 1)
	for i := range t.Zeros {
		t.Zeros[i] = zero
	}
	var blocks []byte
	for r := range n {
		row := w[r*k : (r+1)*k]
		if imp == nil || typ == gguf.Q8_0 {
			var err error
			if blocks, err = gguf.Encode(blocks[:0], typ, row); err != nil {
				return nil, fmt.Errorf("row %d: %w", r, err)
			}
			readBlocks(t, r, typ, blocks)
			continue
		}
		fitWeighted(t, r, row, imp, int32(zero))
	}
	return t, nil
}

// EncodeLegacy returns the ggml blocks of an n×k Q8_0, Q5_0 or Q4_0 tensor fitted without
// importance — the bytes QuantizeLegacy's tensor encodes to (Encode) — written straight from
// the weights a row at a time, with no tensor of codes in between: row(r, buf) returns row r's
// k weights, converted into buf (len k) or a view.
func EncodeLegacy(s quant.Scheme, n, k int, row func(r int, buf []float32) ([]float32, error)) ([]byte, error) {
	typ, ok := TypeOf(s)
	if !ok || !IsLegacy(s) {
		return nil, fmt.Errorf("%s is not one of ggml's Q8_0, Q5_0, Q4_0", s)
	}
	if err := Fits(typ, k); err != nil {
		return nil, err
	}
	out := make([]byte, 0, Bytes(typ, n, k))
	buf := make([]float32, k)
	for r := range n {
		w, err := row(r, buf)
		if err != nil {
			return nil, err
		}
		if out, err = gguf.Encode(out, typ, w); err != nil {
			return nil, fmt.Errorf("row %d: %w", r, err)
		}
	}
	return out, nil
}

// fitWeighted is quantize_row_q4_0_impl / quantize_row_q5_0_impl for row r.
func fitWeighted(t *quant.Tensor, r int, x, imp []float32, nmax int32) {
	var sumX2 float32
	for _, v := range x {
		sumX2 += float32(v * v) // the conversions keep Go from fusing into an FMA, as C does not
	}
	sigma2 := sumX2 / float32(len(x))
	var weight [32]float32
	for b := 0; b < len(x); b += 32 {
		xb := x[b : b+32]
		for j, v := range xb {
			weight[j] = imp[b+j] * sqrt32(sigma2+float32(v*v))
		}
		d := kquant.FitSymmetric(nmax, xb, t.Codes[r*t.K+b:r*t.K+b+32], weight[:])
		t.Scales[(r*t.K+b)/32] = quant.RoundF16(d)
	}
}

// readBlocks takes row r's codes and scales from its ggml blocks.
func readBlocks(t *quant.Tensor, r int, typ gguf.Type, blocks []byte) {
	size := typ.TypeSize()
	for g := 0; g < t.K/32; g++ {
		blk := blocks[g*size : (g+1)*size]
		t.Scales[r*t.K/32+g] = fp.F16ToF32(binary.LittleEndian.Uint16(blk))
		codes := t.Codes[r*t.K+32*g : r*t.K+32*g+32]
		switch typ {
		case gguf.Q8_0:
			for j, q := range blk[2:] {
				codes[j] = uint8(int(int8(q)) + 128)
			}
		default:
			var qh uint32
			qs := blk[2:]
			if typ == gguf.Q5_0 {
				qh, qs = binary.LittleEndian.Uint32(qs), qs[4:]
			}
			for j := range 16 {
				codes[j] = qs[j]&15 | uint8(qh>>j&1)<<4
				codes[j+16] = qs[j]>>4 | uint8(qh>>(j+16)&1)<<4
			}
		}
	}
}

func sqrt32(v float32) float32 { return float32(math.Sqrt(float64(v))) } // exact, as sqrtf
