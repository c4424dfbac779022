package convert

import (
	"slices"
	"testing"

	"github.com/qpack-dev/qpack/alloc"
)

// TestGPUsUsed: RTN without the plan's passes opens only the first GPU asked for, so the CLI
// shows the driver that one alone; a method that calibrates, or a plan that measures, every GPU.
func TestGPUsUsed(t *testing.T) {
	budget := alloc.Options{Strategy: alloc.StrategyBudget}
	for _, c := range []struct {
		name string
		opt  Options
		want []int
	}{
		{"rtn", Options{Method: RTN, Alloc: Uniform(DefaultScheme)}, []int{0}},
		{"rtn on 2,3", Options{Method: RTN, Alloc: Uniform(DefaultScheme), Devices: []int{2, 3}}, []int{2}},
		{"rtn, budget plan", Options{Method: RTN, Alloc: budget, Devices: []int{2, 3}}, []int{2, 3}},
		{"rtn, budget plan, all", Options{Method: RTN, Alloc: budget}, nil},
		{"rtn, imatrix", Options{Method: RTN, Alloc: Uniform(DefaultScheme), Imatrix: true}, nil},
		{"rtn, plan given", Options{Method: RTN, Alloc: budget, Plan: &alloc.Plan{}, Devices: []int{1, 0}}, []int{1}},
		{"gptq", Options{Method: GPTQ, Alloc: Uniform(DefaultScheme)}, nil},
		{"awq on 1,2", Options{Method: AWQ, Alloc: Uniform(DefaultScheme), Devices: []int{1, 2}}, []int{1, 2}},
	} {
		if got := GPUsUsed(c.opt); !slices.Equal(got, c.want) {
			t.Errorf("%s: GPUsUsed = %v, want %v", c.name, got, c.want)
		}
	}
}
