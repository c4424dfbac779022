package iquant

import (
	"math"

	"github.com/qpack-dev/qpack/quant"
)

// Coding with fixed block parameters, for methods that change the weights as they go (GPTQ):
// the block's d and sub-block scales were fitted (Fit, Put) and stay; each group of
// GroupWidth weights is then coded alone, from its weights at that moment, by an exhaustive
// search: every grid point (with the best signs, and δ for iq1_m) is scored by the weighted
// squared error Σ c_j·(x_j − v_j)² of the values v it stands for at the sub-block's factor, the
// lowest wins. Unlike ggml's search, which rounds the weights to levels and looks for grid points
// near them, this finds the best point of the grid for the given factor.

// GroupWidth is the number of adjacent weights coded together: 8 for the lattice types (one
// sign byte: an IQ2 or IQ1 point, two IQ3 points), 1 for iq4_nl and iq4_xs.
func (t *Type) GroupWidth() int {
	if t.Dim == 0 {
		return 1
	}
	return 8
}

// CodeGroup codes the GroupWidth weights x starting at column col of row n of the IQ tensor q
// (col a multiple of GroupWidth), whose block parameters q already holds, minimising
// Σ c_j·(x_j − v_j)² (c_j ≥ 0, the cost of an error in weight j; nil for 1), and stores the
// code(s) in q. For iq1_s the group's δ is the sub-block's, from the block fit.
func (t *Type) CodeGroup(q *quant.Tensor, n, col int, x, c []float32) {
	e, dl := n*q.K+col, q.IQFactor(n, col)
	if c == nil {
		c = ones[:len(x)]
	}
	switch {
	case t.Dim == 0:
		q.Codes[e] = iq4Nearest(x[0], dl)
	case t.Bits == 1:
		t.codeIQ1(q, e, x, c, dl)
	case t.Dim == 4:
		t.codeIQ3(q, e, x, c, dl)
	default:
		p, signs := t.codeSigned(x, c, dl, t.lat().values)
		q.Points[e/8], q.Signs[e/8] = uint16(p), signs
	}
}

var ones = [8]float32{1, 1, 1, 1, 1, 1, 1, 1}

// iq4Nearest is the code whose value dl·v is nearest to x.
func iq4Nearest(x, dl float32) uint8 {
	if dl == 0 {
		return iq4Code(0)
	}
	return iq4Code(x / dl)
}

// signedTables holds, per coordinate of a group and level, the cost of |x_j| against the level's
// value with x_j's own sign (cost) and the extra cost of the opposite sign (flip).
type signedTables struct {
	cost, flip [8][8]float32
}

func newSignedTables(x, c []float32, dl float32, values []int) *signedTables {
	var t signedTables
	for j, v := range x {
		a := float32(math.Abs(float64(v)))
		for l, g := range values {
			m := dl * float32(g)
			t.cost[j][l] = c[j] * (a - m) * (a - m)
			t.flip[j][l] = c[j]*(a+m)*(a+m) - t.cost[j][l]
		}
	}
	return &t
}

// best returns the point of the lattice over coordinates j0 … j0+dim−1 with the lowest cost plus,
// when odd, its cheapest flip, with that cost and the flipped coordinate (−1 for none).
func (st *signedTables) best(lat *lattice, j0 int, odd bool) (point int, cost float32, flipped int) {
	cost, flipped = float32(math.Inf(1)), -1
	for p := range len(lat.levels) / lat.dim {
		var sum float32
		fj, fmin := -1, float32(math.Inf(1))
		for i, l := range lat.point(p) {
			sum += st.cost[j0+i][l]
			if odd && st.flip[j0+i][l] < fmin {
				fj, fmin = j0+i, st.flip[j0+i][l]
			}
		}
		if odd {
			sum += fmin
		}
		if sum < cost {
			point, cost, flipped = p, sum, fj
		}
	}
	return point, cost, flipped
}

// signsOf is the sign byte of x (bit j set for x_j < 0).
func signsOf(x []float32) uint8 {
	var s uint8
	for j, v := range x {
		if v < 0 {
			s |= 1 << j
		}
	}
	return s
}

// codeSigned is CodeGroup for one point of 8 (IQ2): the point and signs; with parity, the
// odd sign count is fixed by flipping the coordinate that costs least.
func (t *Type) codeSigned(x, c []float32, dl float32, values []int) (int, uint8) {
	st, signs := newSignedTables(x, c, dl, values), signsOf(x)
	odd := t.Parity && popcount(signs)%2 == 1
	p, _, fj := st.best(t.lat(), 0, odd)
	if fj >= 0 {
		signs ^= 1 << fj
	}
	return p, signs
}

// codeIQ3 is CodeGroup for two points of 4 under one sign byte. Without parity the halves are
// independent; with it (iq3_xxs) and an odd sign count, one half carries the flip: the better of
// (best half 1 with its flip, best half 2) and (best half 1, best half 2 with its flip).
func (t *Type) codeIQ3(q *quant.Tensor, e int, x, c []float32, dl float32) {
	lat := t.lat()
	st, signs := newSignedTables(x, c, dl, lat.values), signsOf(x)
	p1, c1, _ := st.best(lat, 0, false)
	p2, c2, _ := st.best(lat, 4, false)
	if t.Parity && popcount(signs)%2 == 1 {
		f1, cf1, j1 := st.best(lat, 0, true)
		f2, cf2, j2 := st.best(lat, 4, true)
		if cf1+c2 <= c1+cf2 {
			p1, signs = f1, signs^1<<j1
		} else {
			p2, signs = f2, signs^1<<j2
		}
	}
	q.Points[e/4], q.Points[e/4+1], q.Signs[e/8] = uint16(p1), uint16(p2), signs
}

// codeIQ1 is CodeGroup for an IQ1 point: values dl·(g + δ), δ the sub-block's (iq1_s) or the
// better of ±1/8 (iq1_m).
func (t *Type) codeIQ1(q *quant.Tensor, e int, x, c []float32, dl float32) {
	lat := t.lat()
	deltas := []uint8{q.Signs[e/t.SignGroup]}
	if t.Type == quant.IQ1M {
		deltas = []uint8{0, 1}
	}
	bestCost := float32(math.Inf(1))
	for _, neg := range deltas {
		var st signedTables
		for j, v := range x {
			for l := range lat.values {
				d := v - quant.IQ1Value(dl, uint64(uint8(int8(lat.values[l]))), 0, neg == 1)
				st.cost[j][l] = c[j] * d * d
			}
		}
		if p, cost, _ := st.best(lat, 0, false); cost < bestCost {
			bestCost, q.Points[e/8], q.Signs[e/t.SignGroup] = cost, uint16(p), neg
		}
	}
}

func popcount(s uint8) int {
	n := 0
	for ; s != 0; s &= s - 1 {
		n++
	}
	return n
}
