package quant

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/fp"
)

// bruteNF4 is the nearest NF4 value by exhaustive search in float64; the first (lowest) index
// wins a tie.
func bruteNF4(x float32) uint8 {
	best, bestD := 0, math.Inf(1)
	for i, v := range NF4Values {
		if d := math.Abs(float64(x) - float64(v)); d < bestD {
			best, bestD = i, d
		}
	}
	return uint8(best)
}

func TestNF4TableMatchesBitsandbytes(t *testing.T) {
	// get_4bit_type("nf4") as printed by bitsandbytes (docs/reference/formats.md §4.2), parsed independently.
	want := []float64{-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
		-0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
		0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
		0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0}
	for i, v := range want {
		if float64(NF4Values[i]) != v {
			t.Errorf("NF4Values[%d] = %v, want %v", i, NF4Values[i], v)
		}
		if i > 0 && NF4Values[i] <= NF4Values[i-1] {
			t.Errorf("NF4Values not increasing at %d", i)
		}
	}
}

func TestNF4CodeMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var xs []float32
	for range 200000 {
		xs = append(xs, float32(r.Float64()*2.4-1.2))
	}
	// Every threshold and its float32 neighbours: the places where a sloppy midpoint fails.
	for _, th := range NF4Thresholds() {
		xs = append(xs, th, math.Nextafter32(th, 2), math.Nextafter32(th, -2),
			math.Nextafter32(math.Nextafter32(th, 2), 2))
	}
	xs = append(xs, -1, 1, 0, float32(math.Copysign(0, -1)), 5, -5)
	for _, x := range xs {
		if got, want := NF4Code(x), bruteNF4(x); got != want {
			t.Fatalf("NF4Code(%v) = %d, brute force %d", x, got, want)
		}
	}
}

func TestNF4TieGoesToLowerIndex(t *testing.T) {
	// Find midpoints exactly representable in float32 and check the lower index wins.
	ties := 0
	for i := range 15 {
		mid := (float64(NF4Values[i]) + float64(NF4Values[i+1])) / 2
		if float64(float32(mid)) != mid {
			continue
		}
		ties++
		if got := NF4Code(float32(mid)); got != uint8(i) {
			t.Errorf("NF4Code(midpoint %v of %d,%d) = %d, want %d", mid, i, i+1, got, i)
		}
	}
	if ties == 0 { // the pairs around 0 have exact float32 midpoints (x/2)
		t.Fatal("no exactly representable midpoint found; the tie test checks nothing")
	}
}

func TestNF4Scale(t *testing.T) {
	if s := NF4Scale(0); s != 1 {
		t.Errorf("NF4Scale(0) = %v, want 1", s)
	}
	if s := NF4Scale(0.1); s != RoundF16(0.1) || s == 0.1 {
		t.Errorf("NF4Scale(0.1) = %v, want the F16 rounding %v", s, RoundF16(0.1))
	}
	if s := NF4Scale(1e-9); s != MinF16Scale {
		t.Errorf("NF4Scale(1e-9) = %v, want %v", s, MinF16Scale)
	}
}

func TestBinaryParams(t *testing.T) {
	w := []float32{0.5, -0.25, 1.0, -2.0, 0.3}
	// Symmetric: mean|w| = 4.05/5 = 0.81, rounded to F16.
	s, o := BinaryParams(w, true)
	if o != 0 || s != RoundF16(0.81) {
		t.Errorf("sym params = %v, %v; want %v, 0", s, o, RoundF16(0.81))
	}
	// Asymmetric: offset = F16(mean) = F16(-0.09); scale = F16(mean|w − offset|).
	s, o = BinaryParams(w, false)
	wantO := RoundF16(-0.09)
	var sum float64
	for _, v := range w {
		sum += math.Abs(float64(v) - float64(wantO))
	}
	if o != wantO || s != RoundF16(float32(sum/5)) {
		t.Errorf("asym params = %v, %v; want %v, %v", s, o, RoundF16(float32(sum/5)), wantO)
	}
	if s, _ := BinaryParams([]float32{0, 0}, true); s != MinF16Scale {
		t.Errorf("all-zero group scale = %v, want %v", s, MinF16Scale)
	}
	for _, c := range []struct {
		w, o float32
		want uint8
	}{{0.1, 0, 1}, {-0.1, 0, 0}, {0, 0, 1}, {0.5, 0.6, 0}, {0.6, 0.6, 1}} {
		if got := BinaryCode(c.w, c.o); got != c.want {
			t.Errorf("BinaryCode(%v, %v) = %d, want %d", c.w, c.o, got, c.want)
		}
	}
}

func TestFP8ScaleAndCode(t *testing.T) {
	if s := FP8Scale(896); s != 2 {
		t.Errorf("FP8Scale(896) = %v, want 2", s)
	}
	if s := FP8Scale(0); s != 1 {
		t.Errorf("FP8Scale(0) = %v, want 1", s)
	}
	// 448·s maps to the largest code, 0x7e; a value past it saturates instead of becoming NaN.
	if c := FP8Code(896, 2); c != 0x7e || DequantizeFP8(c, 2) != 896 {
		t.Errorf("FP8Code(896, 2) = %#x", c)
	}
	if c := FP8Code(-1000, 2); c != 0xfe {
		t.Errorf("FP8Code(-1000, 2) = %#x, want 0xfe (−448)", c)
	}
	if v := DequantizeFP8(fp.F32ToE4M3(1.5), 4); v != 6 {
		t.Errorf("DequantizeFP8(e4m3(1.5), 4) = %v, want 6", v)
	}
}

func TestParseSchemeGGMLAliases(t *testing.T) {
	for alias, want := range map[string]string{"q8_0": "int8-g32-sym", "Q5_0": "int5-g32-sym", " q4_0": "int4-g32-sym"} {
		s, err := ParseScheme(alias)
		if err != nil || s.String() != want {
			t.Errorf("ParseScheme(%q) = %v, %v; want %s", alias, s, err, want)
		}
	}
}
