package ggufexport

import (
	"fmt"

	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/quant"
)

// iquantFor returns the IQ type that holds ggml type typ, if typ is one.
func iquantFor(typ gguf.Type) (*iquant.Type, bool) {
	s, ok := ggmltype.SchemeOf(typ)
	if !ok || s.Grid != quant.IQuant {
		return nil, false
	}
	qt, err := iquant.TypeOf(s)
	return qt, err == nil
}

// encodeIQRow appends one row of float weights x as ggml blocks of IQ type qt, fitted without
// importance as ggml_quantize_chunk does with no imatrix (types that need one are refused
// before: requantizable).
func encodeIQRow(dst []byte, qt *iquant.Type, x []float32) ([]byte, error) {
	q := quant.NewIQuantTensor(qt.Scheme, 1, len(x))
	if err := qt.QuantizeRow(q, 0, x, nil); err != nil {
		return nil, err
	}
	return iquant.AppendRows(dst, q)
}

// decode returns the float32 values of tensor t's data b: IQ types through iquant, the others
// through gguf.Decode.
func decode(t gguf.TensorInfo, b []byte) ([]float32, error) {
	qt, ok := iquantFor(t.Type)
	if !ok {
		return gguf.Decode(make([]float32, 0, len(b)), t.Type, b)
	}
	k := int(t.Dims[0])
	if k == 0 || k%qt.Block != 0 || len(b)%(k/qt.Block*qt.BlockBytes) != 0 {
		return nil, fmt.Errorf("%d bytes of %s do not hold rows of %d weights", len(b), t.Type, k)
	}
	q, err := iquant.Decode(qt.Scheme, b, len(b)/(k/qt.Block*qt.BlockBytes), k)
	if err != nil {
		return nil, err
	}
	return q.Dequantize(nil), nil
}
