package blockwise

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// TestGoldenAutoGPTQRTN quantizes the tiny model's block-0 linears with RTN and compares the
// dequantized weights, rounded to F16, with AutoGPTQ's own dequantization of the same
// quantization (testdata/golden/README.md).
//
// One known difference: the golden files derive the asymmetric zero point from the float32
// scale, round(−xmin/scale), and round the scale to F16 only afterwards (codes then use the F16
// scale); quant.IntParamsRange derives the zero from the F16 scale. The two zeros differ only
// when −xmin/scale lies within the F16 rounding error of a half: 6 groups over the four sets
// (2 in int4, 1 in int3, 3 in int2). A zero shifted by one changes a dequantized value only
// where the code clamps (4 elements, all in int2). Every element of every other group must
// match exactly, and in those groups every element must match with the golden zero point.
func TestGoldenAutoGPTQRTN(t *testing.T) {
	const root = "../testdata"
	model, err := safetensors.Open(filepath.Join(root, "models/tiny/model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	for dir, s := range map[string]quant.Scheme{
		"gptq-w4g128-asym":        {Bits: 4, GroupSize: 128},
		"gptq-w3g128-asym-block0": {Bits: 3, GroupSize: 128},
		"gptq-w8g128-sym-block0":  {Bits: 8, GroupSize: 128, Sym: true},
		"gptq-w2g64-asym-block0":  {Bits: 2, GroupSize: 64},
	} {
		path := filepath.Join(root, "golden", dir, "dequantized-block0.safetensors")
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("golden file missing: %v", err)
		}
		golden, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for _, name := range golden.Names() {
			if !strings.HasPrefix(name, "model.layers.0.") || !strings.HasSuffix(name, ".weight") {
				continue
			}
			checkGoldenTensor(t, model, golden, name, s)
			checked++
		}
		golden.Close()
		if checked != 7 {
			t.Errorf("%s: %d block-0 linears, want 7", dir, checked)
		}
	}
}

func checkGoldenTensor(t *testing.T, model, golden *safetensors.Checkpoint, name string, s quant.Scheme) {
	t.Helper()
	info, ok := model.Info(name)
	if !ok || len(info.Shape) != 2 {
		t.Fatalf("%s: not a 2-D tensor of the tiny model", name)
	}
	n, k := info.Shape[0], info.Shape[1]
	w, err := model.Float32(name)
	if err != nil {
		t.Fatal(err)
	}
	want, err := golden.Float32(name)
	if err != nil {
		t.Fatal(err)
	}
	q, err := Quantize(w, n, k, s, Options{})
	if err != nil {
		t.Fatalf("%s %s: %v", s, name, err)
	}
	got := q.Dequantize(nil)
	if len(want) != len(got) {
		t.Fatalf("%s %s: golden has %d values, we have %d", s, name, len(want), len(got))
	}
	bad, zeroDiffs := 0, 0
	for i := range got {
		row, col := i/k, i%k
		gi := row*s.Groups(k) + q.Group(col)
		scale, zero := q.Scales[gi], q.Zeros[gi]
		lo, hi := groupBounds(s, k, q.Group(col))
		if gz := goldenZero(w[row*k+lo:row*k+hi], s); gz != zero {
			if col == lo {
				zeroDiffs++
				t.Logf("%s %s row %d group %d: zero %d, golden derives %d from the float32 scale", s, name, row, q.Group(col), zero, gz)
			}
			zero = gz
		}
		g := quant.RoundF16(quant.DequantizeInt(s.QuantizeInt(w[i], scale, zero), scale, zero))
		if g != want[i] {
			if bad < 5 {
				t.Errorf("%s %s [%d, %d]: w %v → %v, AutoGPTQ %v (code %d, scale %v, zero %d)", s, name, row, col,
					w[i], g, want[i], q.Codes[i], scale, zero)
			}
			bad++
		} else if zero == q.Zeros[gi] && quant.RoundF16(got[i]) != g {
			t.Fatalf("%s %s [%d, %d]: Dequantize %v disagrees with the scalar path %v", s, name, row, col, got[i], g)
		}
	}
	if bad > 0 {
		t.Errorf("%s %s: %d of %d elements differ", s, name, bad, len(got))
	}
	if zeroDiffs > 4 {
		t.Errorf("%s %s: %d groups with a different zero point; expected only rare near-ties", s, name, zeroDiffs)
	}
}

// goldenZero is the golden files' zero point: round(−xmin/scale) with the float32 scale
// (xmax − xmin)/maxq before F16 rounding (GPTQ reference find_params, then a cast to half).
func goldenZero(w []float32, s quant.Scheme) uint8 {
	if s.Sym {
		return uint8((s.MaxQ() + 1) / 2)
	}
	r := minMax(w)
	xmin, xmax := r.lo, r.hi
	if xmin == 0 && xmax == 0 {
		xmin, xmax = -1, 1
	}
	scale := (xmax - xmin) / float32(s.MaxQ())
	return uint8(min(max(math.RoundToEven(float64(-xmin/scale)), 0), float64(s.MaxQ())))
}
