package iquant

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

func allTypes(t testing.TB) []*Type {
	var out []*Type
	for _, it := range quant.IQTypes() {
		s, _ := quant.IQuantScheme(it)
		typ, err := TypeOf(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, typ)
	}
	return out
}

func randomWeights(r *rand.Rand, n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(0.02 * r.NormFloat64())
	}
	return w
}

func randomImportance(r *rand.Rand, n int) []float32 {
	imp := make([]float32, n)
	for i := range imp {
		imp[i] = float32(math.Exp(1.5 * r.NormFloat64()))
	}
	return imp
}

// TestLatticeTables checks the derived search tables: each grid's distinct coordinate values
// are as many as its levels, every point is found again through the map, and every index a
// search can produce is on the grid or has neighbours.
func TestLatticeTables(t *testing.T) {
	levels := map[quant.IQType]int{quant.IQ2XXS: 3, quant.IQ2XS: 3, quant.IQ2S: 3, quant.IQ3XXS: 8, quant.IQ3S: 8, quant.IQ1S: 3, quant.IQ1M: 3}
	for it, n := range levels {
		lat := lattices[it]()
		f, _ := it.Format()
		for p := range f.GridSize {
			for _, l := range lat.point(p) {
				if int(l) >= n {
					t.Fatalf("%s: point %d has level %d", it, p, l)
				}
			}
			if got := lat.onGrid(lat.point(p)); got != p {
				t.Fatalf("%s: point %d is found as %d", it, p, got)
			}
		}
		L := make([]int8, lat.dim)
		for u := range lat.kmap {
			pos := make([]int, lat.dim)
			if !lat.levelsAtMost(u, n-1, pos) {
				continue
			}
			for i := range L {
				L[i] = int8(u >> (lat.shift * i) & (1<<lat.shift - 1))
			}
			if lat.onGrid(L) < 0 && lat.neighbours[-1-lat.kmap[u]] == 0 {
				t.Fatalf("%s: index %#x is off the grid and has no neighbours", it, u)
			}
		}
	}
}

func TestRefusals(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := func(it quant.IQType) quant.Scheme { s, _ := quant.IQuantScheme(it); return s }
	w := randomWeights(r, 512)
	nan := append([]float32{}, w...)
	nan[300] = float32(math.NaN())
	neg := randomImportance(r, 512)
	neg[7] = -1
	huge := append([]float32{}, w...)
	huge[3] = 1e30
	cases := []struct {
		s    quant.Scheme
		w    []float32
		n, k int
		imp  []float32
		want string
	}{
		{s(quant.IQ2XXS), w, 2, 256, nil, "iq2_xxs needs an importance matrix"},
		{s(quant.IQ2XS), w, 2, 256, nil, "needs an importance matrix"},
		{s(quant.IQ1S), w, 2, 256, nil, "needs an importance matrix"},
		{s(quant.IQ3S), w, 4, 128, nil, "whole blocks of 256"},
		{s(quant.IQ4NL), w, 1, 512, neg, "importance 7 is -1"},
		{s(quant.IQ3XXS), nan, 1, 512, nil, "row 0, weight at column 300 is NaN"},
		{s(quant.IQ4NL), huge, 1, 512, nil, "row 0, columns 0…31: block scale d = NaN is not finite"},
		{s(quant.IQ2S), w, 3, 256, nil, "512 weights and 0 importances for a 3x256 tensor"},
	}
	for _, c := range cases {
		_, err := Quantize(c.w, c.n, c.k, c.s, c.imp)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.s, err, c.want)
		}
	}
	if _, err := TypeOf(quant.Scheme{Bits: 4, GroupSize: 128}); err == nil {
		t.Error("TypeOf(int4) succeeded")
	}
	if _, err := Decode(s(quant.IQ2S), make([]byte, 81), 1, 256); err == nil || !strings.Contains(err.Error(), "81 bytes") {
		t.Errorf("Decode of a short block: %v", err)
	}
}

// TestFitIsQuantizeRow checks that Fit on each block of rows of ordinary weights gives what
// QuantizeRow stores (on such rows nothing is carried from block to block) and that Quantize
// over many rows is QuantizeRow row by row.
func TestFitIsQuantizeRow(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n, k = 5, 768
	w := randomWeights(r, n*k)
	imp := randomImportance(r, k)
	for _, typ := range allTypes(t) {
		q, err := Quantize(w, n, k, typ.Scheme, imp)
		if err != nil {
			t.Fatalf("%s: %v", typ.Scheme, err)
		}
		for row := range n {
			for b := range k / typ.Block {
				lo := row*k + b*typ.Block
				p, err := typ.Fit(w[lo:lo+typ.Block], imp[b*typ.Block:(b+1)*typ.Block])
				if err != nil {
					t.Fatal(err)
				}
				if got := typ.Get(q, row, b); !reflect.DeepEqual(got, p) {
					t.Fatalf("%s row %d block %d: Quantize stored %+v, Fit gives %+v", typ.Scheme, row, b, got, p)
				}
			}
		}
		one := quant.NewIQuantTensor(typ.Scheme, 1, k)
		if err := typ.QuantizeRow(one, 0, w[3*k:4*k], imp); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(one.Dequantize(nil), q.Dequantize(nil)[3*k:4*k]) {
			t.Errorf("%s: row 3 of Quantize differs from QuantizeRow", typ.Scheme)
		}
	}
}

// iq4Code's table lookup is ggml's bisection (best_index_int8) for every float32 near the code
// values and the midpoints between them, and for random values.
func TestIQ4CodeIsBisection(t *testing.T) {
	bisect := func(x float32) uint8 {
		v := func(i int) float32 { return float32(quant.IQ4Values[i]) }
		if x <= v(0) {
			return 0
		}
		if x >= v(15) {
			return 15
		}
		ml, mu := 0, 15
		for mu-ml > 1 {
			if mav := (ml + mu) / 2; x < v(mav) {
				mu = mav
			} else {
				ml = mav
			}
		}
		if x-v(mu-1) < v(mu)-x {
			return uint8(mu - 1)
		}
		return uint8(mu)
	}
	var xs []float32
	for i, q := range quant.IQ4Values {
		c := []float32{float32(q)}
		if i < 15 {
			c = append(c, (float32(q)+float32(quant.IQ4Values[i+1]))/2)
		}
		for _, x := range c {
			for _, d := range []float32{x, math.Nextafter32(x, -200), math.Nextafter32(x, 200), x - 0.5, x + 0.5, -x} {
				xs = append(xs, d)
			}
		}
	}
	r := rand.New(rand.NewPCG(8, 8))
	for range 100000 {
		xs = append(xs, float32(300*r.Float64()-150))
	}
	xs = append(xs, 0, float32(math.Copysign(0, -1)), float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)))
	for _, x := range xs {
		if got, want := iq4Code(x), bisect(x); got != want {
			t.Fatalf("iq4Code(%v) = %d, ggml's bisection %d", x, got, want)
		}
	}
}
