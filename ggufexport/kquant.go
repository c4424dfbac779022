package ggufexport

import (
	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// kquantFor returns the k-quant that holds ggml type typ, if typ is one.
func kquantFor(typ gguf.Type) (*kquant.Type, bool) {
	s, ok := ggmltype.SchemeOf(typ)
	if !ok || s.Grid != quant.KQuant {
		return nil, false
	}
	kt, err := kquant.TypeOf(s)
	return kt, err == nil
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
