package quant

import (
	"math"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/fp"
)

func TestMicroscaledNames(t *testing.T) {
	for name, want := range map[string]Scheme{
		"nvfp4": NVFP4Scheme, "MXFP4": MXFP4Scheme, "fp8-b128": FP8BlockScheme(128), "fp8-b64": FP8BlockScheme(64),
	} {
		s, err := ParseScheme(name)
		if err != nil || s != want {
			t.Errorf("ParseScheme(%q) = %v, %v; want %v", name, s, err, want)
			continue
		}
		if back, err := ParseScheme(s.String()); err != nil || back != s {
			t.Errorf("%v does not read back from %q: %v, %v", s, s.String(), back, err)
		}
	}
	if s, err := ParseScheme("fp8"); err != nil || s.Grid != FP8E4M3 {
		t.Errorf(`"fp8" is still per-channel FP8: %v, %v`, s, err)
	}
	for _, bad := range []string{"nvfp4-g32", "mxfp4-sym", "fp8-b0", "fp8-b100", "fp8-bx", "fp8-b128-g64"} {
		if _, err := ParseScheme(bad); err == nil {
			t.Errorf("ParseScheme(%q) accepted", bad)
		}
	}
	for _, s := range []Scheme{{Grid: NVFP4, Bits: 4, GroupSize: 32, Sym: true}, {Grid: MXFP4, Bits: 8, GroupSize: 32, Sym: true},
		{Grid: FP8Block, Bits: 8, GroupSize: 128}} {
		if s.Validate() == nil {
			t.Errorf("%#v validated", s)
		}
	}
}

// The scale rules, checked against values worked out by hand from their definitions.
func TestMicroscaledScales(t *testing.T) {
	if g := NVFP4GlobalScale(2); g != 448*6/2.0 {
		t.Errorf("NVFP4GlobalScale(2) = %v", g)
	}
	if NVFP4GlobalScale(0) != 1 || NVFP4GlobalScale(1e-44) != math.MaxFloat32 {
		t.Errorf("NVFP4GlobalScale edge cases: %v %v", NVFP4GlobalScale(0), NVFP4GlobalScale(1e-44))
	}
	g := NVFP4GlobalScale(2) // the tensor's block with amax 2 gets scale 448
	for _, c := range []struct{ amax, want float32 }{
		{2, 448}, {3, 448}, {1, 224}, {0.1, fp.E4M3ToF32(fp.F32ToE4M3(22.4))}, {0, MinE4M3}, {1e-9, MinE4M3},
	} {
		if got := NVFP4BlockScale(c.amax, g); got != c.want {
			t.Errorf("NVFP4BlockScale(%v) = %v, want %v", c.amax, got, c.want)
		}
	}
	// OCP MX §6.3: X = 2^(floor(log2(amax)) − emax_elem), emax_elem = 2 for E2M1.
	for _, c := range []struct{ amax, want float32 }{
		{1, 0.25}, {7.99, 1}, {8, 2}, {0.75, 0.125}, {6, 1},
		{math.Nextafter32(4, 0), 0.5}, {0, float32(math.Ldexp(1, -127))}, {1e-40, float32(math.Ldexp(1, -127))},
	} {
		if got := MXFP4Scale(c.amax); got != c.want {
			t.Errorf("MXFP4Scale(%v) = %v, want %v", c.amax, got, c.want)
		}
	}
	for e := range 255 {
		if b, ok := E8M0Byte(E8M0Value(uint8(e))); !ok || b != uint8(e) {
			t.Fatalf("E8M0 %d does not round-trip: %d %v", e, b, ok)
		}
	}
	for _, v := range []float32{0, 3, -2, float32(math.Ldexp(1, -128)), float32(math.Ldexp(1, 128))} {
		if _, ok := E8M0Byte(v); ok {
			t.Errorf("E8M0Byte(%v) accepted", v)
		}
	}
	if _, ok := E4M3Byte(1.0625); ok {
		t.Error("E4M3Byte accepted a value between E4M3 values")
	}
}

func TestMicroscaledDequantizeAndValidate(t *testing.T) {
	nv := Tensor{Scheme: NVFP4Scheme, N: 1, K: 16, Codes: make([]uint8, 16), Scales: []float32{448}, GlobalScale: 1344}
	for i := range nv.Codes {
		nv.Codes[i] = uint8(i)
	}
	mx := Tensor{Scheme: MXFP4Scheme, N: 1, K: 32, Codes: make([]uint8, 32), Scales: []float32{0.25}}
	mx.Codes[0], mx.Codes[1], mx.Codes[31] = 7, 15, 3
	fb := Tensor{Scheme: FP8BlockScheme(8), N: 9, K: 10, Codes: make([]uint8, 90), Scales: make([]float32, 18)}
	for n := range 9 {
		fb.Scales[2*n], fb.Scales[2*n+1] = float32(1+n/8), float32(10+n/8)
	}
	fb.Codes[9], fb.Codes[80] = fp.F32ToE4M3(1.5), fp.F32ToE4M3(-2)
	for _, tt := range []*Tensor{&nv, &mx, &fb} {
		if err := tt.Validate(); err != nil {
			t.Fatalf("%s: %v", tt.Scheme, err)
		}
	}
	w := nv.Dequantize(nil)
	for i, v := range w {
		if want := FP4Values[i] * float32(448.0/1344); v != want {
			t.Errorf("nvfp4 value %d = %v, want %v", i, v, want)
		}
	}
	if w := mx.Dequantize(nil); w[0] != 1.5 || w[1] != -1.5 || w[31] != 0.375 || w[2] != 0 {
		t.Errorf("mxfp4 values %v", w)
	}
	if w := fb.Dequantize(nil); w[9] != 15 || w[80] != -4 {
		t.Errorf("fp8 block values %v %v", w[9], w[80])
	}

	bad := func(name string, tt Tensor, mutate func(*Tensor), want string) {
		tt.Codes, tt.Scales = append([]uint8(nil), tt.Codes...), append([]float32(nil), tt.Scales...)
		mutate(&tt)
		if err := tt.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Validate = %v, want an error with %q", name, err, want)
		}
	}
	bad("nvfp4 without global scale", nv, func(t *Tensor) { t.GlobalScale = 0 }, "global scale")
	bad("nvfp4 infinite global scale", nv, func(t *Tensor) { t.GlobalScale = float32(math.Inf(1)) }, "global scale")
	bad("nvfp4 scale between E4M3 values", nv, func(t *Tensor) { t.Scales[0] = 1.0625 }, "E4M3")
	bad("nvfp4 code 16", nv, func(t *Tensor) { t.Codes[3] = 16 }, "not a valid")
	bad("nvfp4 partial block", nv, func(t *Tensor) { t.K, t.Codes = 15, t.Codes[:15] }, "whole blocks")
	bad("mxfp4 scale not a power of two", mx, func(t *Tensor) { t.Scales[0] = 0.3 }, "E8M0")
	bad("mxfp4 global scale", mx, func(t *Tensor) { t.GlobalScale = 2 }, "global scale")
	bad("mxfp4 g_idx", mx, func(t *Tensor) { t.GIdx = make([]int32, 32) }, "g_idx")
	bad("fp8 block rows differ", fb, func(t *Tensor) { t.Scales[2] = 3 }, "first row of its block")
	bad("fp8 block NaN code", fb, func(t *Tensor) { t.Codes[5] = 0x7f }, "not a valid")
	bad("fp8 block zero scale", fb, func(t *Tensor) {
		for n := range 8 {
			t.Scales[2*n] = 0
		}
	}, "positive")
	bad("int4 global scale", Tensor{Scheme: Scheme{Bits: 4, GroupSize: 8}, N: 1, K: 8, Codes: make([]uint8, 8),
		Scales: []float32{1}, Zeros: []uint8{8}}, func(t *Tensor) { t.GlobalScale = 1 }, "global scale")
}
