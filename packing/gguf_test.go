package packing

import (
	"slices"
	"testing"

	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/quant"
)

// GGUF's Layout names and shapes, without packing, exactly what Pack stores for every rung
// (k-quants, IQ types, Q8_0, Q5_0, Q4_0) of whole blocks, and Blocks wraps bytes of that size
// the same way; rows that are not whole blocks are refused by both.
func TestGGUFLayoutIsPacks(t *testing.T) {
	for _, r := range ggmltype.Rungs() {
		const n, k = 3, 512
		var q *quant.Tensor
		switch r.Scheme.Grid {
		case quant.KQuant:
			q = quant.NewKQuantTensor(r.Scheme, n, k)
		case quant.IQuant:
			q = quant.NewIQuantTensor(r.Scheme, n, k)
		default:
			q = &quant.Tensor{Scheme: r.Scheme, N: n, K: k, Codes: make([]uint8, n*k), Scales: make([]float32, n*k/32), Zeros: make([]uint8, n*k/32)}
			for i := range q.Zeros {
				q.Zeros[i] = 1 << (r.Scheme.Bits - 1)
			}
		}
		raws, err := GGUF{}.Pack("m", q)
		if err != nil {
			t.Fatalf("%s: %v", r.Scheme, err)
		}
		l, err := GGUF{}.Layout("m", r.Scheme, n, k)
		if err != nil || len(raws) != 1 || l.Name != raws[0].Name || l.DType != raws[0].DType || !slices.Equal(l.Shape, raws[0].Shape) ||
			l.Shape[0]*l.Shape[1] != len(raws[0].Data) {
			t.Errorf("%s: Layout %+v (%v), Pack stores %s %s %v of %d bytes", r.Scheme, l, err, raws[0].Name, raws[0].DType, raws[0].Shape, len(raws[0].Data))
		}
		b, err := GGUF{}.Blocks("m", r.Scheme, n, k, raws[0].Data)
		if err != nil || !slices.Equal(b[0].Shape, raws[0].Shape) || len(b[0].Data) != len(raws[0].Data) {
			t.Errorf("%s: Blocks %v", r.Scheme, err)
		}
		if _, err := (GGUF{}).Blocks("m", r.Scheme, n, k, raws[0].Data[1:]); err == nil {
			t.Errorf("%s: Blocks took one byte less", r.Scheme)
		}
		if _, err := (GGUF{}).Layout("m", r.Scheme, n, k+16); err == nil {
			t.Errorf("%s: Layout of rows of %d", r.Scheme, k+16)
		}
	}
}
