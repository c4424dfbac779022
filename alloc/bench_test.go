package alloc

import "testing"

// Planning a Llama-2-7B-shaped checkpoint (32 blocks, hidden 4096, MLP 11008, 291 tensors)
// from scratch, measurements included (synthMeasure is cheap, so this times the planner).
func benchmarkPlan(b *testing.B, opts Options) {
	descs := mustDescribe(llamaInfos(32, 4096, 4096, 11008, 32000))
	if len(descs) != 291 {
		b.Fatalf("%d tensors", len(descs))
	}
	for b.Loop() {
		p, err := NewPlanner(descs, gptqCost, nil, synthMeasure)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Plan(opts); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlan7BBudget(b *testing.B) {
	benchmarkPlan(b, Options{Strategy: StrategyBudget, TargetBPW: 4.5})
}

func BenchmarkPlan7BEvolved(b *testing.B) {
	benchmarkPlan(b, Options{Strategy: StrategyEvolved})
}

func BenchmarkPlan7BBudgetWithOverrides(b *testing.B) {
	o, _ := ParseOverrides([]string{`layers\.(0|31)\..*proj=int8-g128-sym`, `v_proj=int8-g128-sym`})
	benchmarkPlan(b, Options{Strategy: StrategyBudget, TargetBPW: 4.5, Overrides: o})
}
