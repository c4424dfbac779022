package quant

import (
	"math"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/fp"
)

func TestDequantizeEveryGrid(t *testing.T) {
	cases := []struct {
		name string
		t    Tensor
		want []float32
	}{
		{"int4 asym, partial group", Tensor{
			Scheme: Scheme{Bits: 4, GroupSize: 8}, N: 1, K: 10,
			Codes:  []uint8{0, 1, 2, 3, 4, 5, 6, 7, 15, 3},
			Scales: []float32{0.5, 2}, Zeros: []uint8{3, 15},
		}, []float32{-1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 0, -24}},
		{"int8 sym", Tensor{
			Scheme: Scheme{Bits: 8, GroupSize: PerChannel, Sym: true}, N: 2, K: 2,
			Codes: []uint8{128, 255, 0, 130}, Scales: []float32{0.25, 1}, Zeros: []uint8{128, 128},
		}, []float32{0, 31.75, -128, 2}},
		{"nf4", Tensor{
			Scheme: Scheme{Bits: 4, GroupSize: 8, Sym: true, Grid: NF4}, N: 1, K: 3,
			Codes: []uint8{0, 7, 15}, Scales: []float32{2},
		}, []float32{-2, 0, 2}},
		{"fp8", Tensor{
			Scheme: Scheme{Bits: 8, Sym: true, Grid: FP8E4M3}, N: 2, K: 2,
			Codes: []uint8{fp.F32ToE4M3(1.5), fp.F32ToE4M3(-448), 0x7e, 0}, Scales: []float32{2, 0.5},
		}, []float32{3, -896, 224, 0}},
		{"binary sym", Tensor{
			Scheme: Scheme{Bits: 1, GroupSize: 8, Sym: true, Grid: Binary}, N: 1, K: 3,
			Codes: []uint8{0, 1, 1}, Scales: []float32{0.5},
		}, []float32{-0.5, 0.5, 0.5}},
		{"binary asym", Tensor{
			Scheme: Scheme{Bits: 1, GroupSize: 8, Grid: Binary}, N: 1, K: 2,
			Codes: []uint8{0, 1}, Scales: []float32{0.5}, Offsets: []float32{1},
		}, []float32{0.5, 1.5}},
		{"int4 with g_idx", Tensor{
			Scheme: Scheme{Bits: 4, GroupSize: 8}, N: 1, K: 10,
			Codes:  []uint8{9, 9, 9, 9, 9, 9, 9, 9, 9, 9},
			Scales: []float32{1, 10}, Zeros: []uint8{8, 8},
			GIdx: []int32{1, 0, 0, 0, 0, 0, 0, 0, 0, 1},
		}, []float32{10, 1, 1, 1, 1, 1, 1, 1, 1, 10}},
	}
	for _, c := range cases {
		if err := c.t.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", c.name, err)
			continue
		}
		got := c.t.Dequantize(make([]float32, 1)) // too small: must grow
		if len(got) != len(c.want) {
			t.Fatalf("%s: %d values, want %d", c.name, len(got), len(c.want))
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: value %d = %v, want %v", c.name, i, got[i], c.want[i])
			}
		}
	}
}

func TestDequantizeReusesDst(t *testing.T) {
	tn := Tensor{Scheme: Scheme{Bits: 4, GroupSize: 8, Sym: true, Grid: NF4}, N: 1, K: 2,
		Codes: []uint8{15, 0}, Scales: []float32{1}}
	buf := make([]float32, 8)
	got := tn.Dequantize(buf)
	if &got[0] != &buf[0] || len(got) != 2 {
		t.Fatalf("Dequantize did not reuse a large enough dst")
	}
}

func TestValidateRejects(t *testing.T) {
	good := func() Tensor {
		return Tensor{Scheme: Scheme{Bits: 4, GroupSize: 8}, N: 2, K: 10,
			Codes:  make([]uint8, 20),
			Scales: []float32{1, 1, 1, 1}, Zeros: []uint8{1, 2, 3, 4}}
	}
	g := good()
	if err := g.Validate(); err != nil {
		t.Fatalf("good tensor: %v", err)
	}
	cases := []struct {
		want   string
		mutate func(*Tensor)
	}{
		{"group size", func(t *Tensor) { t.Scheme.GroupSize = 7 }},
		{"dimensions", func(t *Tensor) { t.N = 0 }},
		{"codes: have 19", func(t *Tensor) { t.Codes = t.Codes[:19] }},
		{"scales: have 3", func(t *Tensor) { t.Scales = t.Scales[:3] }},
		{"zeros: have 0", func(t *Tensor) { t.Zeros = nil }},
		{"offsets", func(t *Tensor) { t.Offsets = []float32{0, 0, 0, 0} }},
		{"code 0x10 at row 1, column 3", func(t *Tensor) { t.Codes[13] = 16 }},
		{"scale 0 at row 1, group 0", func(t *Tensor) { t.Scales[2] = 0 }},
		{"scale NaN", func(t *Tensor) { t.Scales[1] = float32(math.NaN()) }},
		{"scale +Inf", func(t *Tensor) { t.Scales[1] = float32(math.Inf(1)) }},
		{"zero point 16 at row 0, group 1", func(t *Tensor) { t.Zeros[1] = 16 }},
		{"zero point 1 at row 0, group 0 is not valid for int4-g8-sym", func(t *Tensor) { t.Scheme.Sym = true }},
		{"g_idx: have 9", func(t *Tensor) { t.GIdx = make([]int32, 9) }},
		{"g_idx[4] = 2", func(t *Tensor) { t.GIdx = make([]int32, 10); t.GIdx[4] = 2 }},
		{"g_idx[0] = -1", func(t *Tensor) { t.GIdx = make([]int32, 10); t.GIdx[0] = -1 }},
	}
	for _, c := range cases {
		tn := good()
		c.mutate(&tn)
		err := tn.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error containing %q, got %v", c.want, err)
		}
	}
	fp8 := Tensor{Scheme: Scheme{Bits: 8, Sym: true, Grid: FP8E4M3}, N: 1, K: 2,
		Codes: []uint8{0, 0xff}, Scales: []float32{1}}
	if err := fp8.Validate(); err == nil || !strings.Contains(err.Error(), "code 0xff") {
		t.Errorf("FP8 NaN code: got %v", err)
	}
	bin := Tensor{Scheme: Scheme{Bits: 1, GroupSize: 8, Grid: Binary}, N: 1, K: 2,
		Codes: []uint8{0, 1}, Scales: []float32{1}, Offsets: []float32{float32(math.Inf(-1))}}
	if err := bin.Validate(); err == nil || !strings.Contains(err.Error(), "offset -Inf") {
		t.Errorf("binary infinite offset: got %v", err)
	}
	bin.Codes[1] = 2
	bin.Offsets[0] = 0
	if err := bin.Validate(); err == nil || !strings.Contains(err.Error(), "code 0x2") {
		t.Errorf("binary code 2: got %v", err)
	}
}
