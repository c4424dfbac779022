package iquant

import (
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// groupError is Σ c_j·(x_j − v_j)² over the group of width gw at column col of row 0.
func groupError(q *quant.Tensor, col int, x, c []float32) float64 {
	var sum float64
	for j := range x {
		d := float64(x[j] - q.IQValue(0, col+j))
		sum += float64(c[j]) * d * d
	}
	return sum
}

// TestCodeGroupIsOptimal codes every group of fitted blocks again with CodeGroup and checks it
// against a brute force over every grid point, sign pattern (with the parity rule) and δ: the
// error must be the smallest there is at the stored factors, and never above the fit's own.
func TestCodeGroupIsOptimal(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const k = 256
	for _, typ := range allTypes(t) {
		w, imp := randomWeights(r, k), randomImportance(r, k)
		c := randomImportance(r, k)
		q := quant.NewIQuantTensor(typ.Scheme, 1, k)
		if err := typ.QuantizeRow(q, 0, w, imp); err != nil {
			t.Fatal(err)
		}
		gw := typ.GroupWidth()
		groups := 6 // the brute force over 256 sign patterns is slow
		if gw == 1 {
			groups = 32
		}
		for g := range groups {
			col := g * gw
			x, cg := w[col:col+gw], c[col:col+gw]
			before := groupError(q, col, x, cg)
			typ.CodeGroup(q, 0, col, x, cg)
			after := groupError(q, col, x, cg)
			best := bruteForce(typ, q, col, x, cg)
			if after > before*(1+1e-6) || after > best*(1+1e-5)+1e-30 {
				t.Fatalf("%s group %d: CodeGroup's error %g, the fit's %g, the best %g", typ.Scheme, g, after, before, best)
			}
		}
	}
}

// bruteForce is the smallest Σ c_j·(x_j − v_j)² over every code of one group at q's factors.
func bruteForce(typ *Type, q *quant.Tensor, col int, x, c []float32) float64 {
	dl := q.IQFactor(0, col)
	best := 1e300
	try := func(v func(j int) float32) {
		var sum float64
		for j := range x {
			d := float64(x[j] - v(j))
			sum += float64(c[j]) * d * d
		}
		best = min(best, sum)
	}
	f := typ.IQFormat
	switch {
	case f.Dim == 0:
		for code := range 16 {
			try(func(int) float32 { return dl * float32(quant.IQ4Values[code]) })
		}
	case f.Bits == 1:
		deltas := []bool{q.Signs[col/f.SignGroup] != 0}
		if f.Type == quant.IQ1M {
			deltas = []bool{false, true}
		}
		for p := range f.GridSize {
			for _, neg := range deltas {
				try(func(j int) float32 { return quant.IQ1Value(dl, f.Type.GridPoint(uint16(p)), j, neg) })
			}
		}
	default:
		for s := range 256 {
			if f.Parity && bits.OnesCount8(uint8(s))%2 == 1 {
				continue
			}
			// the best point for these signs, point by point (IQ3 has two per sign byte)
			var sum float64
			for h := 0; h < 8; h += f.Dim {
				hb := 1e300
				for p := range f.GridSize {
					var e float64
					for j := range f.Dim {
						v := dl * float32(uint8(f.Type.GridPoint(uint16(p))>>(8*j)))
						if s>>(h+j)&1 == 1 {
							v = -v
						}
						d := float64(x[h+j] - v)
						e += float64(c[h+j]) * d * d
					}
					hb = min(hb, e)
				}
				sum += hb
			}
			best = min(best, sum)
		}
	}
	return best
}
