package ggufexport

import (
	"fmt"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// kquantTypes maps the k-quants' code widths onto ggml's types.
var kquantTypes = map[int]gguf.Type{2: gguf.Q2_K, 3: gguf.Q3_K, 4: gguf.Q4_K, 5: gguf.Q5_K, 6: gguf.Q6_K}

// kquantFor returns the k-quant that holds ggml type typ, if typ is one.
func kquantFor(typ gguf.Type) (*kquant.Type, bool) {
	for bits, t := range kquantTypes {
		if t == typ {
			s, _ := quant.KQuantScheme(bits)
			kt, err := kquant.TypeOf(s)
			return kt, err == nil
		}
	}
	return nil, false
}

// encodeRow appends one row of float weights in type typ: k-quants through kquant's fitting
// without importance (ggml's quantize_row_qX_K_ref, what llama-quantize runs without an
// imatrix), IQ types through iquant's, the other types through gguf.Encode.
func encodeRow(dst []byte, typ gguf.Type, x []float32) ([]byte, error) {
	if qt, ok := iquantFor(typ); ok {
		return encodeIQRow(dst, qt, x)
	}
	kt, ok := kquantFor(typ)
	if !ok {
		return gguf.Encode(dst, typ, x)
	}
	q := quant.NewKQuantTensor(kt.Scheme, 1, len(x))
	if err := kt.QuantizeRow(q, 0, x, nil); err != nil {
		return nil, err
	}
	return kt.AppendRow(dst, q, 0)
}

// repackKQuant writes a k-quant tensor's rows as ggml blocks of its type: the same values,
// which ggml's dequantize_row_qX_K gives back bit for bit.
func repackKQuant(t *quant.Tensor) ([]byte, error) {
	kt, err := kquant.TypeOf(t.Scheme)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, t.N*t.K/quant.SuperBlock*kt.BlockBytes())
	for n := range t.N {
		if out, err = kt.AppendRow(out, t, n); err != nil {
			return nil, fmt.Errorf("row %d: %w", n, err)
		}
	}
	return out, nil
}
