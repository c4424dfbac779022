package blockwise

import (
	"math"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/quant"
)

// RTN to a k-quant is kquant's fitting of every row (ggml's reference fitting; its imatrix
// variant with Imatrix and Importance), on float32 and BF16 input alike, whole and partial
// super-blocks.
func TestKQuantRows(t *testing.T) {
	const n, k = 37, 320 // one whole super-block and a short one of 64 per row
	w := randomWeights(n, k, 21)
	raw := make([]byte, 2*n*k)
	for i, v := range w {
		b := fp.F32ToBF16(v)
		raw[2*i], raw[2*i+1] = byte(b), byte(b>>8)
	}
	wb := bf16Weights(raw)
	imp := make([]float32, k)
	for i := range imp {
		imp[i] = float32(1 + i%7)
	}
	for _, s := range quant.KQuantSchemes() {
		kt, _ := kquant.TypeOf(s)
		for _, opt := range []Options{{}, {Imatrix: true, Importance: imp}} {
			want := quant.NewKQuantTensor(s, n, k)
			for r := range n {
				if err := kt.QuantizeRow(want, r, wb[r*k:(r+1)*k], opt.Importance); err != nil {
					t.Fatal(err)
				}
			}
			got, err := QuantizeBF16(raw, n, k, s, opt)
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			if !equalTensors(got, want) {
				t.Errorf("%s (importance %v): QuantizeBF16 differs from kquant's rows", s, opt.Importance != nil)
			}
			if f32 := mustQuantize(t, wb, n, k, s, opt); !equalTensors(f32, got) {
				t.Errorf("%s: float32 and BF16 input differ", s)
			}
		}
	}
}

func TestKQuantRefusals(t *testing.T) {
	q4, _ := quant.KQuantScheme(4)
	w := randomWeights(3, 320, 22)
	w[2*320+300] = float32(math.Inf(1))
	cases := []struct {
		k    int
		opt  Options
		want string
	}{
		{320, Options{}, "weight at row 2, column 300 is +Inf"},
		{48, Options{}, "whole sub-blocks of 32 weights, not K = 48"},
		{320, Options{Clip: true}, "no clipping search"},
		{320, Options{Importance: make([]float32, 320)}, "set Clip or Imatrix"},
	}
	for _, c := range cases {
		_, err := Quantize(w[:3*c.k], 3, c.k, q4, c.opt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("K=%d %+v: %v, want an error containing %q", c.k, c.opt, err, c.want)
		}
	}
	if (&GPUImatrix{}).Supports(q4) {
		t.Error("the GPU search claims k-quants")
	}
}

// A tensor reused across grids keeps no k-quant parameters, and the other way round.
func TestKQuantReusesTensor(t *testing.T) {
	q6, _ := quant.KQuantScheme(6)
	w := randomWeights(4, 256, 23)
	var dst quant.Tensor
	for _, s := range []quant.Scheme{q6, {Bits: 4, GroupSize: 64}, q6} {
		if err := QuantizeInto(&dst, w, 4, 256, s, Options{}); err != nil {
			t.Fatal(err)
		}
		if err := dst.Validate(); err != nil {
			t.Errorf("%s after reuse: %v", s, err)
		}
	}
}

// RTN to an IQ type is iquant's fitting of every row, with Imatrix and Importance its imatrix
// variant; the types ggml fits only with an importance matrix are refused without one.
func TestIQuantRows(t *testing.T) {
	const n, k = 9, 512
	w := randomWeights(n, k, 24)
	imp := make([]float32, k)
	for i := range imp {
		imp[i] = float32(1 + i%5)
	}
	for _, it := range quant.IQTypes() {
		s, _ := quant.IQuantScheme(it)
		f, _ := s.IQuant()
		for _, opt := range []Options{{}, {Imatrix: true, Importance: imp}} {
			got, err := Quantize(w, n, k, s, opt)
			if f.Imatrix && opt.Importance == nil {
				if err == nil || !strings.Contains(err.Error(), "needs an importance matrix") {
					t.Errorf("%s without importance: %v", s, err)
				}
				continue
			}
			want, werr := iquant.Quantize(w, n, k, s, opt.Importance)
			if err != nil || werr != nil {
				t.Fatalf("%s: %v, %v", s, err, werr)
			}
			if !equalTensors(got, want) {
				t.Errorf("%s (importance %v): Quantize differs from iquant's rows", s, opt.Importance != nil)
			}
		}
	}
	s, _ := quant.IQuantScheme(quant.IQ3S)
	if _, err := Quantize(w[:3*320], 3, 320, s, Options{}); err == nil || !strings.Contains(err.Error(), "whole blocks of 256") {
		t.Errorf("iq3_s with K = 320: %v", err)
	}
	if err := Takes(s, Options{Clip: true}); err == nil {
		t.Error("iq3_s takes --clip")
	}
}
