package alloc

import (
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

func mustOverrides(t *testing.T, specs ...string) []Override {
	t.Helper()
	o, err := ParseOverrides(specs)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestOverridePrecedence(t *testing.T) {
	descs := mustDescribe(llamaInfos(4, 128, 32, 256, 50))
	overrides := mustOverrides(t,
		`layers\.1\..*q_proj=int8`, // first: wins over the next one for block 1
		`q_proj=int2-g64-sym`,
		`layers\.2\.mlp=keep`,
		`lm_head=int8-g128-sym`, // opts the classifier in
		`nothing_matches_this=int4`)
	for _, strategy := range []string{StrategyUniform, StrategyEvolved, StrategyBudget} {
		p := newTestPlanner(t, descs, synthMeasure)
		plan, err := p.Plan(Options{Strategy: strategy, Overrides: overrides, TargetBPW: 6})
		if err != nil {
			t.Fatalf("%s: %v", strategy, err)
		}
		want := map[string]string{
			"model.layers.1.self_attn.q_proj.weight": "int8-g128-asym",
			"model.layers.0.self_attn.q_proj.weight": "int2-g64-sym",
			"model.layers.3.self_attn.q_proj.weight": "int2-g64-sym",
			"model.layers.2.mlp.up_proj.weight":      "keep",
			"lm_head.weight":                         "int8-g128-sym",
		}
		for name, scheme := range want {
			e, _ := plan.Lookup(name)
			if e.Scheme != scheme || !e.Pinned || !strings.HasPrefix(e.Reason, "override /") {
				t.Errorf("%s: %s = %s pinned %v (%s), want %s pinned", strategy, name, e.Scheme, e.Pinned, e.Reason, scheme)
			}
		}
		if e, _ := plan.Lookup("model.layers.1.self_attn.q_proj.weight"); e.Reason != `override /layers\.1\..*q_proj/ → int8-g128-asym` {
			t.Errorf("reason %q", e.Reason)
		}
		if len(plan.Warnings) != 1 || !strings.Contains(plan.Warnings[0], "nothing_matches_this=int4-g128-asym") {
			t.Errorf("%s: warnings %q", strategy, plan.Warnings)
		}
		if plan.Totals.Pinned != 4+3+1 { // q_proj of 4 blocks, the MLP of block 2, lm_head
			t.Errorf("%s: %d pinned, want 8", strategy, plan.Totals.Pinned)
		}
		if strategy == StrategyBudget && plan.Totals.CandidateBPW > 6 {
			t.Errorf("budget with pins: %v bpw over target 6", plan.Totals.CandidateBPW)
		}
	}
}

// A pin that makes the budget infeasible is honoured, and the error says so; a pin is never
// traded away to meet the budget.
func TestOverridePinnedUnderTightBudget(t *testing.T) {
	descs := mustDescribe(llamaInfos(2, 128, 32, 256, 50))
	p := newTestPlanner(t, descs, synthMeasure)
	ladder, _ := ParseLadder("int2-g64-asym,int4-g128-sym")
	overrides := mustOverrides(t, `mlp\.down_proj=keep`)
	_, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, Overrides: overrides, TargetBPW: 3})
	if err == nil || !strings.Contains(err.Error(), "pins as given") {
		t.Fatalf("pinned keep under a 3-bpw budget: %v", err)
	}
	plan, err := p.Plan(Options{Strategy: StrategyBudget, Ladder: ladder, Overrides: overrides, TargetBPW: 6})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range plan.Entries {
		if strings.Contains(e.Name, "down_proj") && (e.Scheme != KeepName || !e.Pinned || !e.Candidate) {
			t.Errorf("%s: %+v", e.Name, e)
		}
	}
	if plan.Totals.CandidateBPW > 6 {
		t.Errorf("%v bpw over 6", plan.Totals.CandidateBPW)
	}
}

func TestOverrideRefusals(t *testing.T) {
	infos := append(llamaInfos(2, 128, 32, 256, 50),
		TensorInfo{"model.layers.0.mlp.gate.weight", []int{8, 128}, "F16"},
		TensorInfo{"model.layers.0.self_attn.q_proj.bias", []int{128}, "F16"})
	descs := mustDescribe(infos)
	cases := []struct{ spec, want string }{
		{`input_layernorm=int8`, "model.layers.0.input_layernorm.weight, a norm tensor, which is never quantized"},
		{`mlp\.gate\.weight=int4`, "a MoE router tensor"},
		{`q_proj\.bias=int8`, "a 1-D (shape [128]) tensor"},
	}
	for _, c := range cases {
		p := newTestPlanner(t, descs, synthMeasure)
		_, err := p.Plan(Options{Strategy: StrategyUniform, Overrides: mustOverrides(t, c.spec)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.spec, err, c.want)
		}
	}
	// keep on a norm is what happens anyway: allowed, and not reported as matching nothing.
	p := newTestPlanner(t, descs, synthMeasure)
	plan, err := p.Plan(Options{Strategy: StrategyUniform, Overrides: mustOverrides(t, `norm=keep`)})
	if err != nil || len(plan.Warnings) != 0 {
		t.Errorf("norm=keep: %v, warnings %q", err, plan.Warnings)
	}
	// A pinned scheme the format cannot hold is refused, naming the tensor.
	noInt8 := func(s quant.Scheme) error {
		if s.Bits == 8 {
			return errFormat
		}
		return nil
	}
	p, _ = NewPlanner(descs, gptqCost, noInt8, synthMeasure)
	_, err = p.Plan(Options{Strategy: StrategyUniform, Overrides: mustOverrides(t, `o_proj=int8`)})
	if err == nil || !strings.Contains(err.Error(), "tensor model.layers.0.self_attn.o_proj.weight") || !strings.Contains(err.Error(), errFormat.Error()) {
		t.Errorf("unsupported pin: %v", err)
	}
	for _, bad := range []string{"q_proj", "=int4", "q_proj=int9", "(=int4"} {
		if _, err := ParseOverride(bad); err == nil {
			t.Errorf("ParseOverride(%q) accepted", bad)
		}
	}
}

var errFormat = errString("format gptq cannot hold 8-bit here")

type errString string

func (e errString) Error() string { return string(e) }
