package alloc

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

func planJSON(t *testing.T, plan *Plan) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := plan.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDeterministicUnderShuffle(t *testing.T) {
	infos := llamaInfos(12, 128, 32, 256, 50)
	overrides := mustOverrides(t, `layers\.3\..*v_proj=int8`)
	for _, opts := range []Options{
		{Strategy: StrategyEvolved, Overrides: overrides},
		{Strategy: StrategyBudget, TargetBPW: 4.2, Overrides: overrides},
	} {
		var first []byte
		rng := rand.New(rand.NewPCG(7, 8))
		for run := range 5 {
			shuffled := append([]TensorInfo(nil), infos...)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			p := newTestPlanner(t, mustDescribe(shuffled), synthMeasure)
			plan, err := p.Plan(opts)
			if err != nil {
				t.Fatal(err)
			}
			got := planJSON(t, plan)
			if run == 0 {
				first = got
			} else if !bytes.Equal(first, got) {
				t.Fatalf("%s: plan differs after shuffling the input", opts.Strategy)
			}
		}
	}
}

// Equal sensitivities everywhere: ties must be broken the same way (by name) every time.
func TestDeterministicTies(t *testing.T) {
	infos := llamaInfos(40, 128, 128, 128, 50) // all linears the same shape and cost
	var first []byte
	for run := range 3 {
		shuffled := append([]TensorInfo(nil), infos...)
		rand.New(rand.NewPCG(uint64(run), 1)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		p, _ := NewPlanner(mustDescribe(shuffled), gptqCost, nil, func(d TensorDesc, s quant.Scheme) (float64, error) {
			return 1 / float64(s.Bits), nil
		})
		plan, err := p.Plan(Options{Strategy: StrategyBudget, TargetBPW: 5})
		if err != nil {
			t.Fatal(err)
		}
		if got := planJSON(t, plan); run == 0 {
			first = got
		} else if !bytes.Equal(first, got) {
			t.Fatal("tied plan differs between runs")
		}
	}
}

func TestPlanJSONRoundTripAndValidate(t *testing.T) {
	descs := mustDescribe(llamaInfos(4, 128, 32, 256, 50))
	p := newTestPlanner(t, descs, synthMeasure)
	plan, err := p.Plan(Options{Strategy: StrategyBudget, TargetBPW: 4, Overrides: mustOverrides(t, `down_proj=int8`, `zzz=keep`)})
	if err != nil {
		t.Fatal(err)
	}
	data := planJSON(t, plan)
	back, err := ReadPlan(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(plan, back) {
		t.Fatalf("round trip changed the plan:\n%s", data)
	}
	if err := back.Validate(descs, nil); err != nil {
		t.Fatalf("Validate of the planner's own plan: %v", err)
	}
	for _, e := range back.Entries {
		c, err := e.Choice()
		if err != nil || c.String() != e.Scheme {
			t.Errorf("%s: choice %v %v", e.Name, c, err)
		}
	}

	mutate := func(f func(p *Plan)) *Plan {
		cp, _ := ReadPlan(bytes.NewReader(data))
		f(cp)
		return cp
	}
	normIdx := indexOfEntry(back, "model.norm.weight")
	cases := []struct {
		plan *Plan
		want string
	}{
		{mutate(func(p *Plan) { p.Entries = p.Entries[1:] }), "missing from the plan"},
		{mutate(func(p *Plan) { p.Entries = append(p.Entries, Entry{Name: "zz.extra.weight", Scheme: "keep"}) }), "zz.extra.weight, which the checkpoint does not have"},
		{mutate(func(p *Plan) { p.Entries[3].Scheme = "int9-g128" }), "integer grid needs 2 to 8 bits"},
		{mutate(func(p *Plan) { p.Entries[normIdx].Scheme = "int4-g128-sym" }), "model.norm.weight: scheme int4-g128-sym on a norm tensor"},
		{mutate(func(p *Plan) { p.Entries[2].Params++ }), "params"},
		{mutate(func(p *Plan) { p.Entries[1], p.Entries[2] = p.Entries[2], p.Entries[1] }), "not sorted"},
	}
	for _, c := range cases {
		if err := c.plan.Validate(descs, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate: %v, want %q", err, c.want)
		}
	}
	if _, err := ReadPlan(strings.NewReader(`{"version":1,"entries":[],"bogus":1}`)); err == nil {
		t.Error("unknown field accepted")
	}
	if _, err := ReadPlan(strings.NewReader(`{"version":2,"entries":[]}`)); err == nil {
		t.Error("unknown version accepted")
	}
}

func indexOfEntry(p *Plan, name string) int {
	for i, e := range p.Entries {
		if e.Name == name {
			return i
		}
	}
	panic(name)
}

func TestExplain(t *testing.T) {
	descs := mustDescribe(llamaInfos(4, 128, 32, 256, 50))
	p := newTestPlanner(t, descs, synthMeasure)
	plan, err := p.Plan(Options{Strategy: StrategyBudget, TargetBPW: 4, Overrides: mustOverrides(t, `layers\.0\..*o_proj=int8`, `nope=keep`)})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := plan.Explain(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"TENSOR", "REASON",
		"norm: never quantized",
		"strategy budget: 39 tensors, 28 quantized, 1 pinned",
		fmt.Sprintf("budget: target 4 bpw; %d bytes for unpinned candidates; solver dp", plan.Budget.FreeBytes),
		`warning: override "nope=keep" matches no tensor`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("Explain output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`layers\.0\.self_attn\.o_proj\.weight +int8-g128-asym \(pinned\) +\d+ +\d\.\d{3} +override`).MatchString(out) {
		t.Errorf("Explain output lacks the pinned o_proj row:\n%s", out)
	}
	if lines := strings.Count(out, "\n"); lines < len(plan.Entries)+4 {
		t.Errorf("Explain printed %d lines for %d entries", lines, len(plan.Entries))
	}
}
