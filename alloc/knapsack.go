package alloc

import (
	"fmt"
	"math"
	"slices"
)

// The budget strategy is a multiple-choice knapsack: every item (tensor) takes exactly one
// option (rung), each with an exact cost in bytes and an error; minimise the total error
// subject to the total cost ≤ capacity.
//
// Two solvers:
//   - solveDP is exact: dynamic programming over the extra cost above every item's cheapest
//     option, in units of the gcd of all cost differences (so no rounding is involved). It runs
//     when states × items stays under maxDPCells.
//   - solveLagrangian otherwise: every item's options reduced to their lower convex hull in
//     (cost, error); all hull steps taken in order of error saved per byte while they fit. That
//     is exactly the solution of argmin Σ err + λ·cost at the critical λ (what a bisection on λ
//     converges to, without the bisection), followed by a fill pass that spends what is left on
//     the best single changes. Its error exceeds the optimum by at most one hull step of one item
//     (the step the LP relaxation would take fractionally); tests check that bound against brute
//     force.

type option struct {
	cost int64   // exact stored bytes
	err  float64 // sensitivity
	rung int     // index into the ladder's rungs (an item lists only the rungs that fit its shape)
}

type item struct {
	name    string
	options []option
}

type solution struct {
	picks  []int   // option index per item
	exact  bool    // solved by DP
	lambda float64 // Lagrangian solver: error per byte of the first step that did not fit (0 if all fit)
}

// maxDPCells bounds the DP table (one byte per cell for backtracking).
const maxDPCells = 1 << 23

func minCost(it item) int64 {
	m := it.options[0].cost
	for _, o := range it.options[1:] {
		m = min(m, o.cost)
	}
	return m
}

func maxCost(it item) int64 {
	m := it.options[0].cost
	for _, o := range it.options[1:] {
		m = max(m, o.cost)
	}
	return m
}

func solveKnapsack(items []item, capacity int64) (solution, error) {
	var base int64
	for _, it := range items {
		base += minCost(it)
	}
	if base > capacity {
		return solution{}, fmt.Errorf("knapsack: cheapest choice needs %d bytes, capacity is %d", base, capacity)
	}
	if unit, states, ok := dpSize(items, capacity-base); ok {
		return solveDP(items, capacity-base, unit, states), nil
	}
	return solveLagrangian(items, capacity), nil
}

// dpSize returns the DP's cost unit and number of states above the base cost, and whether the
// table is small enough.
func dpSize(items []item, extra int64) (unit int64, states int64, ok bool) {
	var g, reach int64
	for _, it := range items {
		if len(it.options) > math.MaxUint8 {
			return 0, 0, false // the backtracking table holds option indices in a byte
		}
		mc, top := minCost(it), int64(0)
		for _, o := range it.options {
			g = gcd(g, o.cost-mc)
			top = max(top, o.cost-mc)
		}
		reach += top
	}
	if g == 0 { // every item has options of one cost only
		return 1, 0, true
	}
	states = min(extra, reach) / g
	return g, states, (states+1)*int64(len(items)) <= maxDPCells
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// solveDP: best[s] is the least error of the items so far using at most s units of extra cost.
// Equal errors keep the lower option index, so the result is deterministic.
func solveDP(items []item, extra, unit, states int64) solution {
	best := make([]float64, states+1)
	next := make([]float64, states+1)
	choice := make([][]uint8, len(items))
	weights := make([][]int64, len(items))
	for i, it := range items {
		mc := minCost(it)
		weights[i] = make([]int64, len(it.options))
		for j, o := range it.options {
			weights[i][j] = (o.cost - mc) / unit
		}
		choice[i] = make([]uint8, states+1)
		for s := int64(0); s <= states; s++ {
			next[s] = math.Inf(1)
			for j, o := range it.options {
				if w := weights[i][j]; w <= s {
					if v := best[s-w] + o.err; v < next[s] {
						next[s], choice[i][s] = v, uint8(j)
					}
				}
			}
		}
		best, next = next, best
	}
	picks := make([]int, len(items))
	s := states
	for i := len(items) - 1; i >= 0; i-- {
		picks[i] = int(choice[i][s])
		s -= weights[i][picks[i]]
	}
	return solution{picks: picks, exact: true}
}

// hullStep moves item from hull position pos to pos+1, saving gain error per byte.
type hullStep struct {
	item, pos int
	gain      float64
}

func solveLagrangian(items []item, capacity int64) solution {
	hulls := make([][]int, len(items))
	picks := make([]int, len(items))
	var used int64
	var steps []hullStep
	for i, it := range items {
		hulls[i] = lowerHull(it.options)
		picks[i] = hulls[i][0]
		used += it.options[picks[i]].cost
		for p := 0; p+1 < len(hulls[i]); p++ {
			a, b := it.options[hulls[i][p]], it.options[hulls[i][p+1]]
			steps = append(steps, hullStep{i, p, (a.err - b.err) / float64(b.cost-a.cost)})
		}
	}
	// Most error saved per byte first; ties by item (items arrive sorted by name), then position,
	// so that an item's steps stay in hull order.
	slices.SortStableFunc(steps, func(x, y hullStep) int {
		switch {
		case x.gain > y.gain:
			return -1
		case x.gain < y.gain:
			return 1
		case x.item != y.item:
			return x.item - y.item
		}
		return x.pos - y.pos
	})
	pos := make([]int, len(items))
	blocked := make([]bool, len(items))
	lambda := 0.0
	for _, st := range steps {
		if blocked[st.item] || pos[st.item] != st.pos {
			continue
		}
		it := items[st.item]
		from, to := hulls[st.item][st.pos], hulls[st.item][st.pos+1]
		delta := it.options[to].cost - it.options[from].cost
		if used+delta > capacity {
			blocked[st.item] = true // its later steps build on this one
			if lambda == 0 {
				lambda = st.gain
			}
			continue
		}
		used += delta
		picks[st.item], pos[st.item] = to, st.pos+1
	}
	fill(items, picks, capacity-used)
	return solution{picks: picks, lambda: lambda}
}

// lowerHull returns the indices of the options on the lower convex hull of (cost, error),
// cost ascending and error strictly descending. Dominated options (no cheaper, no better) drop out.
func lowerHull(opts []option) []int {
	idx := make([]int, len(opts))
	for j := range idx {
		idx[j] = j
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		if opts[a].cost != opts[b].cost {
			return cmpInt64(opts[a].cost, opts[b].cost)
		}
		switch {
		case opts[a].err < opts[b].err:
			return -1
		case opts[a].err > opts[b].err:
			return 1
		}
		return 0
	})
	var hull []int
	for _, j := range idx {
		if len(hull) > 0 && opts[j].err >= opts[hull[len(hull)-1]].err {
			continue
		}
		for len(hull) >= 2 && !turnsConvex(opts[hull[len(hull)-2]], opts[hull[len(hull)-1]], opts[j]) {
			hull = hull[:len(hull)-1]
		}
		hull = append(hull, j)
	}
	return hull
}

// turnsConvex reports whether b saves strictly more error per byte from a than c does from b.
func turnsConvex(a, b, c option) bool {
	return (a.err-b.err)*float64(c.cost-b.cost) > (b.err-c.err)*float64(b.cost-a.cost)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// fill repeatedly applies the single option change that lowers the error most and fits in the
// bytes left, until none does.
func fill(items []item, picks []int, left int64) {
	for {
		bestGain, bi, bj := 0.0, -1, -1
		for i, it := range items {
			cur := it.options[picks[i]]
			for j, o := range it.options {
				if gain := cur.err - o.err; gain > bestGain && o.cost-cur.cost <= left {
					bestGain, bi, bj = gain, i, j
				}
			}
		}
		if bi < 0 {
			return
		}
		left -= items[bi].options[bj].cost - items[bi].options[picks[bi]].cost
		picks[bi] = bj
	}
}
