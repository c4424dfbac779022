package alloc

import (
	"math"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// tieMLP ties each block's gate_proj and up_proj (one shape), as GGUF ties a block's experts.
func tieMLP(name string) string {
	if b, ok := strings.CutSuffix(name, "gate_proj.weight"); ok {
		return b
	}
	if b, ok := strings.CutSuffix(name, "up_proj.weight"); ok {
		return b
	}
	return ""
}

// Tied tensors take one rung: the budget solves each group as one item (the exact optimum over
// groups, found by brute force here), evolved decides each group on its mean sensitivity.
func TestTiedTensorsTakeOneChoice(t *testing.T) {
	descs := mustDescribe(llamaInfos(1, 128, 32, 256, 50))
	ladder, _ := ParseLadder("int2-g64-asym,int4-g128-sym,int8-g128-sym")
	for _, target := range []float64{2.6, 3.1, 4.0, 5.2} {
		plan, err := newTestPlanner(t, descs, synthMeasure).Plan(Options{Strategy: StrategyBudget, Ladder: ladder, TargetBPW: target, Tie: tieMLP})
		if err != nil {
			t.Fatalf("target %g: %v", target, err)
		}
		gate, _ := plan.Lookup("model.layers.0.mlp.gate_proj.weight")
		up, _ := plan.Lookup("model.layers.0.mlp.up_proj.weight")
		if gate.Scheme != up.Scheme {
			t.Errorf("target %g: tied gate_proj %s, up_proj %s", target, gate.Scheme, up.Scheme)
		}
		groups := map[string]*item{}
		var items []*item
		var params int64
		for _, d := range descs {
			if !d.Role.IsLinear() {
				continue
			}
			params += d.Params
			key := tieMLP(d.Name)
			it := groups[key]
			if it == nil || key == "" {
				it = &item{name: d.Name, options: make([]option, len(ladder))}
				groups[key], items = it, append(items, it)
			}
			for r, c := range ladder {
				e, _ := synthMeasure(d, c.Scheme)
				it.options[r].cost += gptqCost(c.Scheme, d.Shape[0], d.Shape[1])
				it.options[r].err += e
			}
		}
		var flat []item
		for _, it := range items {
			flat = append(flat, *it)
		}
		if len(flat) != 6 {
			t.Fatalf("%d groups, want 6", len(flat))
		}
		opt, _ := bruteForce(flat, int64(math.Floor(target*float64(params)/8)))
		if math.Abs(plan.Totals.Sensitivity-opt) > 1e-12 {
			t.Errorf("target %g: total sensitivity %v, brute force over the groups %v", target, plan.Totals.Sensitivity, opt)
		}
	}

	descs = mustDescribe(llamaInfos(16, 64, 16, 96, 100))
	ladder, _ = ParseLadder("int4-g64-sym,int8-g64-sym")
	// gate_proj alone would take the high rung (0.0015 > 0.001); with up_proj the mean does not.
	p := newTestPlanner(t, descs, func(d TensorDesc, _ quant.Scheme) (float64, error) {
		if strings.HasSuffix(d.Name, "gate_proj.weight") {
			return 0.0015, nil
		}
		return 0.0001, nil
	})
	plan, err := p.Plan(Options{Strategy: StrategyEvolved, Ladder: ladder, Tie: tieMLP})
	if err != nil {
		t.Fatal(err)
	}
	gate, _ := plan.Lookup("model.layers.8.mlp.gate_proj.weight")
	up, _ := plan.Lookup("model.layers.8.mlp.up_proj.weight")
	if gate.Scheme != "int4-g64-sym" || up.Scheme != gate.Scheme || !strings.Contains(gate.Reason, "mean of 2 tied tensors") {
		t.Errorf("evolved: gate_proj %s (%s), up_proj %s", gate.Scheme, gate.Reason, up.Scheme)
	}
}

// Overrides that pin some tensors of a group and not others are refused before anything is
// measured, naming both.
func TestTiedPinsRefused(t *testing.T) {
	descs := mustDescribe(llamaInfos(2, 64, 16, 96, 100))
	ov, _ := ParseOverrides([]string{`layers\.1\.mlp\.gate_proj=int8-g64-sym`})
	p := newTestPlanner(t, descs, synthMeasure)
	_, err := p.Plan(Options{Strategy: StrategyBudget, TargetBPW: 4, Overrides: ov, Tie: tieMLP})
	if err == nil || !strings.Contains(err.Error(), "model.layers.1.mlp.gate_proj.weight") || !strings.Contains(err.Error(), "model.layers.1.mlp.up_proj.weight") {
		t.Errorf("error %v", err)
	}
	if p.Measurements() != 0 {
		t.Errorf("%d measurements before the refusal", p.Measurements())
	}
	ov, _ = ParseOverrides([]string{`layers\.1\.mlp\.(gate|up)_proj=int8-g64-sym`})
	plan, err := p.Plan(Options{Strategy: StrategyUniform, Ladder: []Choice{SchemeChoice(mustScheme("int4-g64-sym"))}, Overrides: ov, Tie: tieMLP})
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := plan.Lookup("model.layers.1.mlp.up_proj.weight"); e.Scheme != "int8-g64-sym" {
		t.Errorf("up_proj pinned with its group: %s", e.Scheme)
	}
	tieShapes := func(name string) string { // gate_proj [96, 64] and down_proj [64, 96]
		if strings.Contains(name, "layers.0.mlp.gate_proj") || strings.Contains(name, "layers.0.mlp.down_proj") {
			return "x"
		}
		return ""
	}
	if _, err := p.Plan(Options{Strategy: StrategyUniform, Ladder: []Choice{SchemeChoice(mustScheme("int4-g64-sym"))}, Tie: tieShapes}); err == nil || !strings.Contains(err.Error(), "differ in shape") {
		t.Errorf("tied tensors of different shapes: error %v", err)
	}
}
