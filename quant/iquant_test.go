package quant_test

import (
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

func TestIQuantSchemes(t *testing.T) {
	bpw := map[string]float64{"iq4_nl": 4.5, "iq4_xs": 4.25, "iq3_s": 3.4375, "iq3_xxs": 3.0625, "iq2_s": 2.5625,
		"iq2_xs": 2.3125, "iq2_xxs": 2.0625, "iq1_m": 1.75, "iq1_s": 1.5625}
	for _, it := range quant.IQTypes() {
		s, err := quant.IQuantScheme(it)
		if err != nil {
			t.Fatal(err)
		}
		back, err := quant.ParseScheme(strings.ToUpper(s.String()))
		if err != nil || back != s {
			t.Errorf("%s: ParseScheme(%q) = %v, %v", it, s, back, err)
		}
		f, ok := s.IQuant()
		if !ok || f.BitsPerWeight() != bpw[s.String()] {
			t.Errorf("%s: %v bits per weight, want %v (ggml's block size)", s, f.BitsPerWeight(), bpw[s.String()])
		}
		q := quant.NewIQuantTensor(s, 2, 512)
		if err := q.Validate(); err != nil {
			t.Errorf("%s: a zeroed tensor: %v", s, err)
		}
		for i, v := range q.Dequantize(nil) {
			if v != 0 {
				t.Fatalf("%s: a zeroed tensor dequantizes to %g at %d", s, v, i)
			}
		}
	}
	for name, want := range map[string]string{"iq2_xxs-g64": "takes no group size", "iq5_xs": "unknown IQ type"} {
		if _, err := quant.ParseScheme(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseScheme(%q): %v, want an error containing %q", name, err, want)
		}
	}
	bad := []quant.Scheme{{Grid: quant.IQuant, IQ: quant.IQ2XS, Bits: 2, GroupSize: 32, Sym: true}, {Grid: quant.IQuant, Bits: 2, GroupSize: 16},
		{Grid: quant.Integer, IQ: quant.IQ2S, Bits: 4, GroupSize: 128}}
	for _, s := range bad {
		if err := s.Validate(); err == nil {
			t.Errorf("%#v: valid", s)
		}
	}
	s, _ := quant.IQuantScheme(quant.IQ3S)
	if err := s.CheckRowLength(384); err == nil || !strings.Contains(err.Error(), "whole blocks of 256") {
		t.Errorf("iq3_s with K = 384: %v", err)
	}
}

func TestIQuantValidateRejects(t *testing.T) {
	scheme := func(it quant.IQType) quant.Scheme { s, _ := quant.IQuantScheme(it); return s }
	cases := []struct {
		s      quant.Scheme
		want   string
		mutate func(t *quant.Tensor)
	}{
		{scheme(quant.IQ2XXS), "needs an even number of minus signs", func(t *quant.Tensor) { t.Signs[3] = 1 }},
		{scheme(quant.IQ2XS), "grid point 512 at row 1, column 8", func(t *quant.Tensor) { t.Points[len(t.Points)/2+1] = 512 }},
		{scheme(quant.IQ3S), "sub-block scale 16", func(t *quant.Tensor) { t.SubScales[0] = 16 }},
		{scheme(quant.IQ4XS), "sub-block scale -33", func(t *quant.Tensor) { t.SubScales[0] = -33 }},
		{scheme(quant.IQ4NL), "code 0x10", func(t *quant.Tensor) { t.Codes[5] = 16 }},
		{scheme(quant.IQ1M), "delta sign 2", func(t *quant.Tensor) { t.Signs[0] = 2 }},
		{scheme(quant.IQ2S), "block scale NaN", func(t *quant.Tensor) { t.Scales[0] = float32(nan()) }},
		{scheme(quant.IQ3XXS), "signs: have", func(t *quant.Tensor) { t.Signs = t.Signs[1:] }},
		{scheme(quant.IQ2S), "act-order", func(t *quant.Tensor) { t.GIdx = make([]int32, t.K) }},
	}
	for _, c := range cases {
		tn := quant.NewIQuantTensor(c.s, 2, 512)
		c.mutate(tn)
		if err := tn.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.s, err, c.want)
		}
	}
}

func nan() float64 { var z float64; return z / z }
