package alloc

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// One block: 7 free linears × 3 rungs = 2187 assignments, few enough to enumerate.
func TestBudgetMatchesBruteForce(t *testing.T) {
	descs := mustDescribe(llamaInfos(1, 128, 32, 256, 50))
	ladder, _ := ParseLadder("int2-g64-asym,int4-g128-sym,int8-g128-sym")
	for _, target := range []float64{2.6, 3.1, 4.0, 5.2, 7.0, 9.0} {
		p := newTestPlanner(t, descs, synthMeasure)
		plan, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBPW: target})
		if err != nil {
			t.Fatalf("target %g: %v", target, err)
		}
		if plan.Totals.CandidateBPW > target {
			t.Errorf("target %g: plan takes %v bpw", target, plan.Totals.CandidateBPW)
		}
		var items []item
		var params int64
		for _, d := range descs {
			if !d.Role.IsLinear() {
				continue
			}
			params += d.Params
			it := item{name: d.Name}
			for _, c := range ladder {
				e, _ := synthMeasure(d, c.Scheme)
				it.options = append(it.options, option{cost: gptqCost(c.Scheme, d.Shape[0], d.Shape[1]), err: e})
			}
			items = append(items, it)
		}
		opt, _ := bruteForce(items, int64(math.Floor(target*float64(params)/8)))
		if math.Abs(plan.Totals.Sensitivity-opt) > 1e-12 || plan.Budget.Solver != "dp" {
			t.Errorf("target %g: total sensitivity %v by %s, brute force %v", target, plan.Totals.Sensitivity, plan.Budget.Solver, opt)
		}
	}
}

// A target at or above what the ladder's top costs says so: the budget does not limit the plan.
func TestBudgetAboveTheTopSaysSo(t *testing.T) {
	descs := mustDescribe(llamaInfos(1, 128, 32, 256, 50))
	ladder, _ := ParseLadder("int2-g64-asym,int4-g128-sym,int8-g128-sym")
	for target, want := range map[float64]bool{20: true, 8.5: true, 4.5: false} {
		plan, err := newTestPlanner(t, descs, synthMeasure).Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBPW: target})
		if err != nil {
			t.Fatal(err)
		}
		said := strings.Contains(strings.Join(plan.Warnings, "\n"), "at or above the ladder's top")
		if said != want {
			t.Errorf("target %g: warnings %q", target, plan.Warnings)
		}
	}
}

func TestBudgetSizeTargetAndKeepRung(t *testing.T) {
	descs := mustDescribe(llamaInfos(2, 128, 32, 256, 50))
	var input int64
	for _, d := range descs {
		input += d.KeepBytes()
	}
	p := newTestPlanner(t, descs, synthMeasure)
	plan, err := p.Plan(Options{Strategy: StrategyBudget, TargetBytes: input})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Totals.Bytes > input || plan.Totals.InputBytes != input {
		t.Errorf("size %d over target %d (input %d)", plan.Totals.Bytes, input, plan.Totals.InputBytes)
	}
	// The default ladder's top rung is keep, whose error is 0: with the input's size as budget,
	// every linear should be kept (the quantized rungs only add error).
	if plan.Totals.Quantized != 0 {
		t.Errorf("budget = input size should keep everything, quantized %d", plan.Totals.Quantized)
	}
}

func TestBudgetInfeasible(t *testing.T) {
	descs := mustDescribe(llamaInfos(2, 128, 32, 256, 50))
	p := newTestPlanner(t, descs, synthMeasure)
	ladder, _ := ParseLadder("int4-g128-sym,int8-g128-sym")
	var bytes, params int64
	for _, d := range descs {
		if d.Role.IsLinear() {
			bytes += gptqCost(mustScheme("int4-g128-sym"), d.Shape[0], d.Shape[1])
			params += d.Params
		}
	}
	least := math.Ceil(float64(bytes)*8/float64(params)*1e4) / 1e4
	_, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBPW: 3})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("minimum achievable %.4f bpw", least)) {
		t.Errorf("infeasible bpw: %v, want the minimum %.4f", err, least)
	}
	var kept int64
	for _, d := range descs {
		if !d.Role.IsLinear() {
			kept += d.KeepBytes()
		}
	}
	_, err = p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBytes: 1000})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("minimum achievable %d bytes", bytes+kept)) {
		t.Errorf("infeasible size: %v, want the minimum %d", err, bytes+kept)
	}
	if p.Measurements() != 0 {
		t.Errorf("%d measurements before refusing an infeasible budget", p.Measurements())
	}
	// The printed minimum is itself achievable.
	if _, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBPW: least}); err != nil {
		t.Errorf("target at the printed minimum %v: %v", least, err)
	}
	if _, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder}); err == nil {
		t.Error("a budget without a target must fail")
	}
}

func TestBudgetCachesMeasurements(t *testing.T) {
	descs := mustDescribe(llamaInfos(3, 128, 32, 256, 50))
	p := newTestPlanner(t, descs, synthMeasure)
	ladder, _ := ParseLadder("int2-g64-asym,int4-g128-sym,int8-g128-sym")
	if _, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBPW: 4}); err != nil {
		t.Fatal(err)
	}
	if n := p.Measurements(); n != 21*3 {
		t.Errorf("measured %d pairs, want 21 linears × 3 rungs", n)
	}
	for _, target := range []float64{3, 5, 6} {
		if _, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBPW: target}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Plan(Options{Strategy: StrategyEvolved, Ladder: ladder}); err != nil {
		t.Fatal(err)
	}
	if n := p.Measurements(); n != 21*3 {
		t.Errorf("after more plans: %d measurements, want still %d", n, 21*3)
	}
}

func TestBudgetUnsupportedRungLeftOut(t *testing.T) {
	descs := mustDescribe(llamaInfos(2, 128, 32, 256, 50))
	no3 := func(s quant.Scheme) error {
		if s.Bits == 3 {
			return fmt.Errorf("format gptq: no 3-bit kernels")
		}
		return nil
	}
	p, _ := NewPlanner(descs, gptqCost, no3, synthMeasure)
	plan, err := p.Plan(Options{Strategy: StrategyBudget, TargetBPW: 3.4})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range plan.Entries {
		if strings.HasPrefix(e.Scheme, "int3") {
			t.Errorf("%s got unsupported %s", e.Name, e.Scheme)
		}
	}
	if len(plan.Warnings) != 1 || !strings.Contains(plan.Warnings[0], "int3-g128-sym left out: format gptq") {
		t.Errorf("warnings %q", plan.Warnings)
	}
}

// A Llama-2-7B-shaped list is too big for the exact DP; the Lagrangian solver must meet the
// target and use nearly all of it.
func TestBudgetLarge(t *testing.T) {
	descs := mustDescribe(llamaInfos(32, 4096, 4096, 11008, 32000))
	p := newTestPlanner(t, descs, synthMeasure)
	plan, err := p.Plan(Options{Strategy: StrategyBudget, TargetBPW: 4.5})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Entries) != 291 || plan.Budget.Solver != "lagrangian" {
		t.Fatalf("%d entries, solver %s", len(plan.Entries), plan.Budget.Solver)
	}
	if bpw := plan.Totals.CandidateBPW; bpw > 4.5 || bpw < 4.45 {
		t.Errorf("candidate bpw %v, want just under 4.5", bpw)
	}
	if !strings.HasPrefix(plan.Entries[100].Reason, "budget: λ=") {
		t.Errorf("reason %q", plan.Entries[100].Reason)
	}
}

// A k-quant rung applies only to tensors whose rows hold whole sub-blocks: the others choose
// among the remaining rungs, and a tensor that fits no rung is named in the error.
func TestBudgetSkipsRungsATensorCannotTake(t *testing.T) {
	descs := mustDescribe(llamaInfos(1, 256, 64, 48, 50)) // down_proj rows are 48 wide
	ladder, _ := ParseLadder("q2_k,int4-g128-sym,int8-g128-sym")
	p := newTestPlanner(t, descs, synthMeasure)
	plan, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBPW: 4})
	if err != nil {
		t.Fatal(err)
	}
	kquants := 0
	for _, e := range plan.Entries {
		if strings.HasPrefix(e.Scheme, "q2_k") {
			kquants++
			if strings.HasSuffix(e.Name, "down_proj.weight") {
				t.Errorf("%s (K = 48) got %s", e.Name, e.Scheme)
			}
		}
	}
	if kquants == 0 {
		t.Error("no tensor took the k-quant rung under a tight budget")
	}
	only, _ := ParseLadder("q4_k")
	_, err = newTestPlanner(t, descs, synthMeasure).Plan(Options{Strategy: StrategyBudget, Ladder: only, TargetBPW: 5})
	if err == nil || !strings.Contains(err.Error(), "down_proj.weight fits none of the ladder's rungs") || !strings.Contains(err.Error(), "not K = 48") {
		t.Errorf("a tensor no rung fits: %v", err)
	}
}

// superBlockFallback stands in for GGUF: k-quants need rows of whole 256-weight super-blocks,
// else q4_k falls back to int5-g32-sym and the others have no substitute.
func superBlockFallback(s quant.Scheme, n, k int) (Choice, string, error) {
	if s.Grid != quant.KQuant || k%256 == 0 {
		return SchemeChoice(s), "", nil
	}
	if s.Bits == 4 {
		return SchemeChoice(mustScheme("int5-g32-sym")), "rows of 384 are not whole super-blocks", nil
	}
	return Choice{}, "", fmt.Errorf("%s has no fallback", s)
}

// A format's fallbacks replace uniform and pinned choices, naming why, and the budget never
// picks a rung the format would not store as it is.
func TestFallback(t *testing.T) {
	descs := mustDescribe(llamaInfos(2, 384, 128, 1024, 512)) // down_proj rows are 1024: whole super-blocks
	p := newTestPlanner(t, descs, synthMeasure)
	q4k := mustScheme("q4_k")
	plan, err := p.Plan(Options{Strategy: StrategyUniform, Ladder: []Choice{SchemeChoice(q4k)}, Fallback: superBlockFallback})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range plan.Entries {
		switch {
		case strings.HasSuffix(e.Name, "down_proj.weight") && e.Scheme != "q4_k":
			t.Errorf("%s: %s, want q4_k", e.Name, e.Scheme)
		case strings.HasSuffix(e.Name, "q_proj.weight") && (e.Scheme != "int5-g32-sym" || !strings.Contains(e.Reason, "super-blocks")):
			t.Errorf("%s: %s (%s), want the fallback", e.Name, e.Scheme, e.Reason)
		}
	}
	if _, err := p.Plan(Options{Strategy: StrategyUniform, Ladder: []Choice{SchemeChoice(mustScheme("q3_k"))}, Fallback: superBlockFallback}); err == nil || !strings.Contains(err.Error(), "no fallback") {
		t.Errorf("q3_k without a fallback: %v", err)
	}
	ladder := []Choice{SchemeChoice(mustScheme("q2_k")), SchemeChoice(mustScheme("int4-g32-sym")), SchemeChoice(mustScheme("q5_k")), SchemeChoice(mustScheme("int8-g32-sym"))}
	unstorable := func(fb FallbackFunc) int {
		plan, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBPW: 5, Fallback: fb})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range plan.Entries {
			if strings.HasSuffix(e.Name, "proj.weight") && !strings.HasSuffix(e.Name, "down_proj.weight") && strings.HasSuffix(e.Scheme, "_k") {
				n++
			}
		}
		return n
	}
	if n := unstorable(nil); n == 0 {
		t.Fatal("without the format's word the budget picks no k-quant for 384-wide rows: the test shows nothing")
	}
	if n := unstorable(superBlockFallback); n != 0 {
		t.Errorf("the budget gave %d tensors a k-quant the format cannot store", n)
	}
}
