package alloc

import (
	"fmt"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

func TestDescribe(t *testing.T) {
	descs := mustDescribe(llamaInfos(3, 64, 16, 96, 100))
	byName := map[string]TensorDesc{}
	for _, d := range descs {
		byName[d.Name] = d
	}
	q := byName["model.layers.2.self_attn.q_proj.weight"]
	if q.Role != model.RoleAttnQ || q.Block != 2 || q.NumBlocks != 3 || q.Params != 64*64 || q.RelPos() != 1 {
		t.Errorf("q_proj of block 2: %+v relpos %v", q, q.RelPos())
	}
	if e := byName["model.embed_tokens.weight"]; e.Role != model.RoleEmbedding || e.Block != -1 || e.KeepBytes() != 100*64*2 {
		t.Errorf("embedding: %+v", e)
	}
	if byName["model.layers.0.mlp.down_proj.weight"].RelPos() != 0 {
		t.Error("block 0 should be at relative position 0")
	}
	bad := []struct {
		infos []TensorInfo
		want  string
	}{
		{[]TensorInfo{{"a.weight", []int{2, 2}, "F16"}, {"a.weight", []int{2, 2}, "F16"}}, "listed twice"},
		{[]TensorInfo{{"a.weight", []int{2, 2}, "Q4"}}, `unknown dtype "Q4"`},
		{[]TensorInfo{{"a.weight", []int{2, -2}, "F16"}}, "negative dimension"},
	}
	for _, b := range bad {
		if _, err := Describe(b.infos); err == nil || !strings.Contains(err.Error(), b.want) || !strings.Contains(err.Error(), "a.weight") {
			t.Errorf("Describe(%v) error %v, want one naming a.weight with %q", b.infos, err, b.want)
		}
	}
}

func newTestPlanner(t *testing.T, descs []TensorDesc, measure MeasureFunc) *Planner {
	t.Helper()
	p, err := NewPlanner(descs, gptqCost, nil, measure)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCandidatesAndProtection(t *testing.T) {
	infos := append(llamaInfos(4, 64, 16, 96, 100),
		TensorInfo{"model.layers.1.mlp.gate.weight", []int{8, 64}, "F16"}, // MoE router
		TensorInfo{"model.layers.1.self_attn.q_proj.bias", []int{64}, "F16"},
		TensorInfo{"model.layers.1.mlp.experts.3.down_proj.weight", []int{64, 96}, "F16"})
	descs := mustDescribe(infos)
	for _, strategy := range []string{StrategyUniform, StrategyEvolved} {
		for _, optIn := range []bool{false, true} {
			p := newTestPlanner(t, descs, func(TensorDesc, quant.Scheme) (float64, error) { return 0, nil })
			plan, err := p.Plan(Options{Strategy: strategy, QuantizeEmbeddings: optIn, QuantizeHead: optIn})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range plan.Entries {
				d := descs[indexOf(descs, e.Name)]
				wantQuant := d.Role.IsLinear() && len(d.Shape) == 2 ||
					optIn && (d.Role == model.RoleEmbedding || d.Role == model.RoleClassifier)
				if (e.Scheme != KeepName) != wantQuant {
					t.Errorf("%s opt-in %v: %s got %s (%s)", strategy, optIn, e.Name, e.Scheme, e.Reason)
				}
				if e.Candidate != wantQuant {
					t.Errorf("%s: %s candidate=%v", strategy, e.Name, e.Candidate)
				}
			}
			if e, _ := plan.Lookup("model.layers.1.mlp.gate.weight"); !strings.Contains(e.Reason, "router") {
				t.Errorf("router reason %q", e.Reason)
			}
			if e, _ := plan.Lookup("model.norm.weight"); !strings.Contains(e.Reason, "norm") {
				t.Errorf("norm reason %q", e.Reason)
			}
			head, _ := plan.Lookup("lm_head.weight")
			if strategy == StrategyEvolved && optIn && (head.Scheme != "int8-g128-sym" || head.Reason != "rule: classifier protected") {
				t.Errorf("evolved opted-in classifier: %+v", head)
			}
			if !optIn && !strings.Contains(head.Reason, "classifier: protected") {
				t.Errorf("classifier reason %q", head.Reason)
			}
		}
	}
}

func indexOf(descs []TensorDesc, name string) int {
	for i, d := range descs {
		if d.Name == name {
			return i
		}
	}
	panic(name)
}

// With every measured sensitivity 0, exactly the edge blocks take the high rung.
func TestEvolvedEdgeBlocks(t *testing.T) {
	cases := []struct {
		blocks int
		high   []int
	}{
		{41, []int{0, 1, 2, 3, 37, 38, 39, 40}}, // 3/40 = 7.5% exactly: protected at both ends
		{32, []int{0, 1, 2, 29, 30, 31}},        // 7.5%·31 = 2.325 blocks
		{16, []int{0, 1, 14, 15}},               // 1/15 = 6.7% in, 2/15 = 13.3% out
		{2, []int{0, 1}},
		{1, []int{0}},
	}
	for _, c := range cases {
		descs := mustDescribe(llamaInfos(c.blocks, 64, 16, 96, 100))
		p := newTestPlanner(t, descs, func(TensorDesc, quant.Scheme) (float64, error) { return 0, nil })
		plan, err := p.Plan(Options{Strategy: StrategyEvolved})
		if err != nil {
			t.Fatal(err)
		}
		for b := range c.blocks {
			want := "int4-g128-sym"
			for _, h := range c.high {
				if h == b {
					want = "int8-g128-sym"
				}
			}
			e, _ := plan.Lookup(fmt.Sprintf("model.layers.%d.mlp.down_proj.weight", b))
			if e.Scheme != want {
				t.Errorf("%d blocks, block %d: %s (%s), want %s", c.blocks, b, e.Scheme, e.Reason, want)
			}
			if want == "int8-g128-sym" && !strings.Contains(e.Reason, "% of blocks") {
				t.Errorf("%d blocks, block %d: reason %q", c.blocks, b, e.Reason)
			}
		}
	}
}

func TestEvolvedThresholdStrict(t *testing.T) {
	descs := mustDescribe(llamaInfos(20, 64, 16, 96, 100))
	var measured []string
	measure := func(d TensorDesc, s quant.Scheme) (float64, error) {
		measured = append(measured, d.Name+" "+s.String())
		switch {
		case strings.HasSuffix(d.Name, "q_proj.weight"):
			return 0.001, nil // equal: not greater, stays low
		case strings.HasSuffix(d.Name, "k_proj.weight"):
			return 0.0010000001, nil
		}
		return 0.0002, nil
	}
	p := newTestPlanner(t, descs, measure)
	plan, err := p.Plan(Options{Strategy: StrategyEvolved})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := plan.Lookup("model.layers.10.self_attn.q_proj.weight")
	k, _ := plan.Lookup("model.layers.10.self_attn.k_proj.weight")
	if q.Scheme != "int4-g128-sym" || q.Reason != "measured sensitivity 0.001 ≤ 0.001" {
		t.Errorf("q_proj at exactly the threshold: %s (%s)", q.Scheme, q.Reason)
	}
	if k.Scheme != "int8-g128-sym" || !strings.HasPrefix(k.Reason, "measured sensitivity 0.001 > 0.001") {
		t.Errorf("k_proj just above the threshold: %s (%s)", k.Scheme, k.Reason)
	}
	if k.Sensitivity["int4-g128-sym"] != 0.0010000001 || len(k.Sensitivity) != 1 {
		t.Errorf("k_proj sensitivities %v", k.Sensitivity)
	}
	// 20 blocks: 0, 1 and 18, 19 are edges (1/19 = 5.3%, 2/19 = 10.5%); 16 middle blocks × 7
	// linears, each measured once, at the low rung only.
	if len(measured) != 16*7 {
		t.Errorf("measured %d (tensor, scheme) pairs, want %d", len(measured), 16*7)
	}
	for _, m := range measured {
		if !strings.HasSuffix(m, " int4-g128-sym") || strings.Contains(m, "layers.1.") || strings.Contains(m, "layers.19.") {
			t.Errorf("unexpected measurement %s", m)
		}
	}
	if e, _ := plan.Lookup("model.layers.0.self_attn.q_proj.weight"); e.Sensitivity != nil {
		t.Errorf("edge tensor has sensitivities %v; nothing should have been measured", e.Sensitivity)
	}
}

func TestEvolvedCustomRule(t *testing.T) {
	descs := mustDescribe(llamaInfos(10, 64, 16, 96, 100))
	p := newTestPlanner(t, descs, func(TensorDesc, quant.Scheme) (float64, error) { return 0.01, nil })
	ladder, _ := ParseLadder("int2-g64-asym,int4-g128-sym,keep")
	plan, err := p.Plan(Options{Strategy: StrategyEvolved, Ladder: ladder, Evolved: &EvolvedRule{EdgeFraction: 0, Threshold: 0.05}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"model.layers.0.mlp.up_proj.weight", "model.layers.5.mlp.up_proj.weight"} {
		if e, _ := plan.Lookup(name); e.Scheme != "int2-g64-asym" {
			t.Errorf("%s: %s (%s), want the low rung int2-g64-asym", name, e.Scheme, e.Reason)
		}
	}
	if e, _ := plan.Lookup("model.layers.9.mlp.up_proj.weight"); e.Scheme != "int2-g64-asym" {
		t.Errorf("last block with edge fraction 0: %s (%s)", e.Scheme, e.Reason)
	}
}

func TestUniform(t *testing.T) {
	descs := mustDescribe(llamaInfos(2, 64, 16, 96, 100))
	p := newTestPlanner(t, descs, nil)
	ladder, _ := ParseLadder("int3-g64-asym")
	plan, err := p.Plan(Options{Strategy: StrategyUniform, Ladder: ladder})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Totals.Quantized != 14 || p.Measurements() != 0 {
		t.Errorf("quantized %d (want 14), measured %d (want 0)", plan.Totals.Quantized, p.Measurements())
	}
	e, _ := plan.Lookup("model.layers.1.mlp.down_proj.weight")
	if want := gptqCost(mustScheme("int3-g64-asym"), 64, 96); e.Bytes != want || e.BPW != float64(want)*8/(64*96) {
		t.Errorf("down_proj bytes %d bpw %v, want %d", e.Bytes, e.BPW, want)
	}
	noInt3 := func(s quant.Scheme) error {
		if s.Bits == 3 {
			return fmt.Errorf("gptq format: no 3-bit")
		}
		return nil
	}
	p2, _ := NewPlanner(descs, gptqCost, noInt3, nil)
	if _, err := p2.Plan(Options{Strategy: StrategyUniform, Ladder: ladder}); err == nil || !strings.Contains(err.Error(), "no 3-bit") {
		t.Errorf("unsupported uniform scheme: %v", err)
	}
	if _, err := p.Plan(Options{Strategy: "fancy"}); err == nil || !strings.Contains(err.Error(), "unknown strategy") {
		t.Errorf("unknown strategy: %v", err)
	}
}
