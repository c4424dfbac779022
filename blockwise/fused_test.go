package blockwise

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// bf16Weights decodes raw little-endian BF16 bytes.
func bf16Weights(raw []byte) []float32 {
	w := make([]float32, len(raw)/2)
	for i := range w {
		w[i] = fp.BF16ToF32(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8)
	}
	return w
}

// sameRaws reports the first difference between two packed outputs, or "".
func sameRaws(got, want []packing.Raw) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d tensors, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Name != w.Name || g.DType != w.DType || !slices.Equal(g.Shape, w.Shape) {
			return fmt.Sprintf("tensor %s %s %v, want %s %s %v", g.Name, g.DType, g.Shape, w.Name, w.DType, w.Shape)
		}
		if string(g.Data) != string(w.Data) {
			return fmt.Sprintf("tensor %s: data differs", g.Name)
		}
	}
	return ""
}

// The fused quantize-and-pack must give exactly the bytes of Quantize then GPTQ.PackInto, for
// every integer scheme, both GPTQ formats, BF16 and float32 input, with and without clipping,
// on shapes where K is not a multiple of the group and N not one of the row block (the larger
// shape is split over goroutines). dst and t are reused from case to case, as a converter does.
func TestFusedGPTQMatchesQuantizeThenPack(t *testing.T) {
	schemes := []quant.Scheme{
		{Bits: 4, GroupSize: 128}, {Bits: 4, GroupSize: 128, Sym: true}, {Bits: 4, GroupSize: 40},
		{Bits: 3, GroupSize: 128}, {Bits: 3, GroupSize: 64, Sym: true},
		{Bits: 2, GroupSize: 64}, {Bits: 2, GroupSize: quant.PerChannel, Sym: true},
		{Bits: 8, GroupSize: 128}, {Bits: 8, GroupSize: quant.PerChannel, Sym: true},
	}
	shapes := [][2]int{{1, 288}, {37, 288}, {531, 288}}
	var dst []packing.Raw
	var fusedT quant.Tensor
	for i, nk := range shapes {
		n, k := nk[0], nk[1]
		raw := randomBF16(n, k, uint64(40+i))
		w := bf16Weights(raw)
		for _, s := range schemes {
			for _, f := range []packing.GPTQ{{}, {V2: true}} {
				for _, clip := range []bool{false, true} {
					if clip && n > 40 {
						continue // the clip search is slow; the small shapes cover it
					}
					opt := Options{Clip: clip}
					name := fmt.Sprintf("%s %s %dx%d clip %v", s, f.Name(), n, k, clip)
					ref, err := f.Pack("m", mustQuantize(t, w, n, k, s, opt))
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if dst, err = QuantizeBF16PackGPTQ(dst, &fusedT, f, "m", raw, n, k, s, opt); err != nil {
						t.Fatalf("%s: BF16: %v", name, err)
					}
					if d := sameRaws(dst, ref); d != "" {
						t.Fatalf("%s: BF16: %s", name, d)
					}
					if dst, err = QuantizePackGPTQ(dst, &fusedT, f, "m", w, n, k, s, opt); err != nil {
						t.Fatalf("%s: float32: %v", name, err)
					}
					if d := sameRaws(dst, ref); d != "" {
						t.Fatalf("%s: float32: %s", name, d)
					}
					if len(fusedT.Codes) != 0 || len(fusedT.Scales) != n*s.Groups(k) {
						t.Fatalf("%s: t holds %d codes and %d scales", name, len(fusedT.Codes), len(fusedT.Scales))
					}
				}
			}
		}
	}
}

// Bad input gets the errors of the two separate steps, not a panic.
func TestFusedGPTQErrors(t *testing.T) {
	const n, k = 20, 64
	raw := randomBF16(n, k, 50)
	int4 := quant.Scheme{Bits: 4, GroupSize: 32}
	nan := slices.Clone(raw)
	nan[2*(17*k+5)], nan[2*(17*k+5)+1] = 0xc0, 0x7f // row 17, column 5
	var q quant.Tensor
	fused := func(raw []byte, n, k int, s quant.Scheme) error {
		_, err := QuantizeBF16PackGPTQ(nil, &q, packing.GPTQ{}, "m", raw, n, k, s, Options{})
		return err
	}
	cases := []struct {
		err  error
		want string
	}{
		{fused(raw[1:], n, k, int4), "bytes of BF16"},
		{fused(raw, n, k, quant.Scheme{Bits: 4, GroupSize: 32, Grid: quant.NF4, Sym: true}), "integer"},
		{fused(raw[:2*n*36], n, 36, quant.Scheme{Bits: 3, GroupSize: quant.PerChannel}), "multiple of 32"},
		{fused(nan, n, k, int4), "row 17, column 5"},
		{fused(raw, n, k, quant.Scheme{Bits: 5, GroupSize: 32}), "2/3/4/8-bit"},
	}
	for _, c := range cases {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("want an error containing %q, got %v", c.want, c.err)
		}
	}
	if _, err := QuantizePackGPTQ(nil, &q, packing.GPTQ{}, "m", make([]float32, 5), n, k, int4, Options{}); err == nil {
		t.Error("float32 weights of the wrong length: no error")
	}
	w := bf16Weights(raw)
	w[3] = float32(math.Inf(-1))
	if _, err := QuantizePackGPTQ(nil, &q, packing.GPTQ{}, "m", w, n, k, int4, Options{}); err == nil || !strings.Contains(err.Error(), "row 0, column 3") {
		t.Errorf("infinite weight: got %v", err)
	}
}
