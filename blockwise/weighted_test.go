package blockwise

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// weightedError is Σ imp·(w − deq)² (imp = 1 when nil) over w.
func weightedError(w, deq, imp []float32) float64 {
	var sum float64
	for i := range w {
		d := float64(w[i] - deq[i])
		c := 1.0
		if imp != nil {
			c = float64(imp[i%len(imp)])
		}
		sum += c * d * d
	}
	return sum
}

// skewedImportance is an imatrix-like importance: heavy-tailed, a few channels dominating.
func skewedImportance(k int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 3))
	imp := make([]float32, k)
	for i := range imp {
		imp[i] = float32(r.ExpFloat64() * r.ExpFloat64() * r.ExpFloat64())
	}
	return imp
}

func weightedSchemes() []quant.Scheme {
	return []quant.Scheme{
		{Bits: 2, GroupSize: 64}, {Bits: 3, GroupSize: 128}, {Bits: 3, GroupSize: 128, Sym: true},
		{Bits: 4, GroupSize: 128}, {Bits: 4, GroupSize: 32, Sym: true}, {Bits: 8, GroupSize: PerChannelForTest},
		{Grid: quant.NF4, Bits: 4, GroupSize: 64, Sym: true}, quant.NVFP4Scheme, quant.MXFP4Scheme,
	}
}

// PerChannelForTest is quant.PerChannel, named for the table above.
const PerChannelForTest = quant.PerChannel

// The weighted search keeps plain RTN unless a candidate is strictly better, so no group's
// weighted squared error may grow; on heavy-tailed weights it must shrink overall.
func TestWeightedNeverWorseThanRTN(t *testing.T) {
	const n, k = 8, 384
	w := randomWeights(n, k, 21)
	imp := skewedImportance(k, 22)
	for _, s := range weightedSchemes() {
		for _, importance := range [][]float32{nil, imp} {
			plain := mustQuantize(t, w, n, k, s, Options{}).Dequantize(nil)
			searched := mustQuantize(t, w, n, k, s, Options{Imatrix: true, Importance: importance}).Dequantize(nil)
			var totalPlain, totalSearched float64
			for row := range n {
				for g := range s.Groups(k) {
					lo, hi := groupBounds(s, k, g)
					var gimp []float32
					if importance != nil {
						gimp = importance[lo:hi]
					}
					a, b := row*k+lo, row*k+hi
					ep, es := weightedError(w[a:b], plain[a:b], gimp), weightedError(w[a:b], searched[a:b], gimp)
					if es > ep*(1+1e-9) {
						t.Fatalf("%s row %d group %d: searched error %v > RTN %v", s, row, g, es, ep)
					}
					totalPlain += ep
					totalSearched += es
				}
			}
			want := 0.95 // 8-bit RTN is already close to its optimum
			switch {
			case s.Bits == 8:
				want = 0.999
			case s.Grid == quant.MXFP4: // its only freedom: five power-of-two scales per block
				want = 0.995
			}
			if totalSearched > want*totalPlain {
				t.Errorf("%s (importance %v): weighted search error %.4g is not below %g × RTN's %.4g", s, importance != nil, totalSearched, want, totalPlain)
			}
		}
	}
}

// With an importance, the search must beat the same search without it on the weighted error:
// that is what the imatrix is for.
func TestImportanceBeatsUnweightedSearch(t *testing.T) {
	const n, k = 32, 384
	w := randomWeights(n, k, 23)
	imp := skewedImportance(k, 24)
	for _, s := range weightedSchemes() {
		with := mustQuantize(t, w, n, k, s, Options{Imatrix: true, Importance: imp}).Dequantize(nil)
		without := mustQuantize(t, w, n, k, s, Options{Imatrix: true}).Dequantize(nil)
		clip := mustQuantize(t, w, n, k, s, Options{Clip: true, Importance: imp}).Dequantize(nil)
		ew, eu, ec := weightedError(w, with, imp), weightedError(w, without, imp), weightedError(w, clip, imp)
		if ew >= 0.97*eu {
			t.Errorf("%s: weighted error with importance %.4g, without %.4g: want at least 3%% lower", s, ew, eu)
		}
		if ew > ec {
			t.Errorf("%s: weighted search error %.4g above the clip search's %.4g (same importance)", s, ew, ec)
		}
	}
}

// GroupParams with Imatrix gives the parameters Quantize chose for that group.
func TestGroupParamsWeightedMatchesQuantize(t *testing.T) {
	const n, k = 4, 256
	w := randomWeights(n, k, 25)
	imp := skewedImportance(k, 26)
	s := quant.Scheme{Bits: 3, GroupSize: 128}
	opt := Options{Imatrix: true, Importance: imp}
	q := mustQuantize(t, w, n, k, s, opt)
	codes := make([]uint8, 128)
	for row := range n {
		for g := range 2 {
			lo := g * 128
			scale, zero := GroupParams(s, w[row*k+lo:row*k+lo+128], imp[lo:lo+128], opt, codes)
			if i := row*2 + g; scale != q.Scales[i] || zero != q.Zeros[i] {
				t.Fatalf("row %d group %d: GroupParams (%g, %d), Quantize (%g, %d)", row, g, scale, zero, q.Scales[i], q.Zeros[i])
			}
		}
	}
}

// BenchmarkWeightedSearch: RTN with the importance-weighted search on a 1024×1024 int3-g128
// asymmetric weight (bytes: float32 input).
func BenchmarkWeightedSearch(b *testing.B) {
	const n, k = 1024, 1024
	w := randomWeights(n, k, 27)
	opt := Options{Imatrix: true, Importance: skewedImportance(k, 28)}
	s := quant.Scheme{Bits: 3, GroupSize: 128}
	b.SetBytes(4 * n * k)
	dst := new(quant.Tensor)
	for b.Loop() {
		if err := QuantizeInto(dst, w, n, k, s, opt); err != nil {
			b.Fatal(err)
		}
	}
}

// Options.Params: encoding with the parameters a search found reproduces its tensor; wrong
// lengths and non-integer grids are refused.
func TestQuantizeWithFittedParams(t *testing.T) {
	const n, k = 9, 200
	w := randomWeights(n, k, 41)
	for _, s := range []quant.Scheme{{Bits: 3, GroupSize: 64}, {Bits: 6, GroupSize: quant.PerChannel, Sym: true}} {
		want := mustQuantize(t, w, n, k, s, Options{Imatrix: true, Importance: skewedImportance(k, 42)})
		got := mustQuantize(t, w, n, k, s, Options{Params: &FittedGroups{Scales: want.Scales, Zeros: want.Zeros}})
		if !slices.Equal(got.Codes, want.Codes) || !slices.Equal(got.Scales, want.Scales) || !slices.Equal(got.Zeros, want.Zeros) {
			t.Errorf("%s: encoding with the searched parameters differs from the search's tensor", s)
		}
	}
	bad := &FittedGroups{Scales: make([]float32, n), Zeros: make([]uint8, n)}
	if _, err := Quantize(w, n, k, quant.Scheme{Bits: 4, GroupSize: 128}, Options{Params: bad}); err == nil || !strings.Contains(err.Error(), "18 groups") {
		t.Errorf("too few parameters: %v", err)
	}
}
