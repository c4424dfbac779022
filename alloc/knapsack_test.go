package alloc

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// bruteForce returns the least total error of any feasible pick, and whether one exists.
func bruteForce(items []item, capacity int64) (float64, bool) {
	best, found := math.Inf(1), false
	var walk func(i int, cost int64, err float64)
	walk = func(i int, cost int64, err float64) {
		if cost > capacity {
			return
		}
		if i == len(items) {
			if err < best {
				best, found = err, true
			}
			return
		}
		for _, o := range items[i].options {
			walk(i+1, cost+o.cost, err+o.err)
		}
	}
	walk(0, 0, 0)
	return best, found
}

func evaluate(items []item, picks []int) (cost int64, err float64) {
	for i, j := range picks {
		cost += items[i].options[j].cost
		err += items[i].options[j].err
	}
	return cost, err
}

// randomItems makes ladder-like items: cost rising with the rung, error mostly falling, with
// some non-convex and dominated options; costs share a random factor so the DP's gcd matters.
func randomItems(rng *rand.Rand, n int) []item {
	unit := int64(1 + rng.IntN(50))
	items := make([]item, n)
	for i := range items {
		k := 1 + rng.IntN(5)
		size := int64(1 + rng.IntN(40))
		e := 0.05 + rng.Float64()
		opts := make([]option, k)
		for j := range opts {
			opts[j] = option{cost: unit * size * int64(j+1+rng.IntN(3)), err: e}
			e *= 0.1 + 0.8*rng.Float64()
			if rng.IntN(6) == 0 {
				e *= 3 // a worse, dearer option: dominated
			}
		}
		items[i] = item{name: fmt.Sprintf("t%02d", i), options: opts}
	}
	return items
}

func TestKnapsackAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var gapSum float64
	for trial := range 400 {
		items := randomItems(rng, 1+rng.IntN(7))
		var lo, hi int64
		for _, it := range items {
			lo += minCost(it)
			hi += it.options[len(it.options)-1].cost * 2
		}
		capacity := lo + rng.Int64N(hi-lo+1)
		opt, ok := bruteForce(items, capacity)
		if !ok {
			t.Fatalf("trial %d: instance built infeasible", trial)
		}
		dp, err := solveKnapsack(items, capacity)
		if err != nil || !dp.exact {
			t.Fatalf("trial %d: small instance not solved exactly by DP: %v", trial, err)
		}
		cost, e := evaluate(items, dp.picks)
		if cost > capacity || math.Abs(e-opt) > 1e-12*(1+opt) {
			t.Fatalf("trial %d: DP cost %d (cap %d) error %v, optimum %v", trial, cost, capacity, e, opt)
		}
		lg := solveLagrangian(items, capacity)
		cost, e = evaluate(items, lg.picks)
		if cost > capacity {
			t.Fatalf("trial %d: Lagrangian cost %d over capacity %d", trial, cost, capacity)
		}
		if bound := maxHullStep(items); e > opt+bound+1e-12 {
			t.Fatalf("trial %d: Lagrangian error %v exceeds optimum %v by more than one hull step %v", trial, e, opt, bound)
		}
		gapSum += e - opt
	}
	t.Logf("mean Lagrangian gap over 400 instances: %.3g", gapSum/400)
}

// maxHullStep is the stated tolerance of the Lagrangian solver: the largest error one hull
// step of one item saves.
func maxHullStep(items []item) float64 {
	m := 0.0
	for _, it := range items {
		h := lowerHull(it.options)
		for p := 0; p+1 < len(h); p++ {
			m = max(m, it.options[h[p]].err-it.options[h[p+1]].err)
		}
	}
	return m
}

func TestKnapsackInfeasible(t *testing.T) {
	items := []item{{"a", []option{{cost: 10, err: 1}, {cost: 20}}}, {"b", []option{{cost: 5, err: 1}}}}
	if _, err := solveKnapsack(items, 14); err == nil {
		t.Error("capacity below the cheapest picks must fail")
	}
	sol, err := solveKnapsack(items, 15)
	if err != nil || sol.picks[0] != 0 {
		t.Errorf("capacity exactly the cheapest: %v %v", sol.picks, err)
	}
}

func TestLowerHull(t *testing.T) {
	// (cost, err): 25/0.6 is dominated by 20/0.5; 30/0.45 lies above the segment 20/0.5–40/0.1
	// (it saves 0.005 per byte, the next step 0.035), so it is not on the hull.
	opts := []option{{cost: 10, err: 1}, {cost: 20, err: 0.5}, {cost: 30, err: 0.45}, {cost: 25, err: 0.6}, {cost: 40, err: 0.1}}
	got := lowerHull(opts)
	want := []int{0, 1, 4}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("hull %v, want %v", got, want)
	}
}

// The fill pass spends bytes left after the hull walk on options off the hull: A's hull step
// (1→11 bytes) does not fit after B's, but A's off-hull option at 4 bytes does.
func TestLagrangianFill(t *testing.T) {
	items := []item{
		{"a", []option{{cost: 1, err: 1}, {cost: 4, err: 0.9}, {cost: 11}}},
		{"b", []option{{cost: 1, err: 1}, {cost: 5, err: 0.5}}},
	}
	sol := solveLagrangian(items, 10)
	if fmt.Sprint(sol.picks) != "[1 1]" || sol.lambda != 0.1 {
		t.Errorf("picks %v λ %v, want [1 1] and λ 0.1 (A's rejected step)", sol.picks, sol.lambda)
	}
}

// QPackLadder: valid, with NF4 and every k-quant, every integer width from 2 to 8 but 7.
func TestQPackLadder(t *testing.T) {
	l := QPackLadder()
	if err := checkLadder(l); err != nil {
		t.Fatal(err)
	}
	bits, grids := map[int]bool{}, map[quant.Grid]int{}
	for _, c := range l {
		bits[c.Scheme.Bits] = bits[c.Scheme.Bits] || c.Scheme.Grid == quant.Integer
		grids[c.Scheme.Grid]++
	}
	if grids[quant.NF4] == 0 || grids[quant.KQuant] != 5 || !bits[2] || !bits[3] || !bits[4] || !bits[5] || !bits[6] || !bits[8] {
		t.Errorf("QPackLadder() = %v", l)
	}
}
