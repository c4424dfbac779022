package alloc

import (
	"fmt"
	"slices"
)

// Tied tensors take one choice: Options.Tie names the group each tensor belongs to (a GGUF
// file holds a block's experts in one merged tensor of one ggml type). Every strategy decides a
// group as one: uniform trivially, evolved on the members' mean sensitivity, budget as one
// knapsack item whose cost and error are the members' sums.

// tiedGroups partitions the free candidates into groups of tied tensors, in the order of their
// first member; a tensor not tied to any other is a group of one. The members of a group must
// have one shape, so that the format stores them alike.
func (p *Planner) tiedGroups(tie func(string) string, free []int) ([][]int, error) {
	var groups [][]int
	at := map[string]int{} // group key → index in groups
	for _, i := range free {
		key := ""
		if tie != nil {
			key = tie(p.tensors[i].Name)
		}
		g, ok := at[key]
		if key == "" || !ok {
			if key != "" {
				at[key] = len(groups)
			}
			groups = append(groups, []int{i})
			continue
		}
		first := p.tensors[groups[g][0]]
		if t := p.tensors[i]; !slices.Equal(t.Shape, first.Shape) {
			return nil, fmt.Errorf("tensors %s %v and %s %v are tied (%s) but differ in shape", first.Name, first.Shape, t.Name, t.Shape, key)
		}
		groups[g] = append(groups[g], i)
	}
	return groups, nil
}

// checkTiedPins refuses overrides that pin some members of a group and not others, or pin them
// differently, before anything is measured.
func (p *Planner) checkTiedPins(tie func(string) string, verdicts []verdict) error {
	if tie == nil {
		return nil
	}
	first := map[string]int{}
	for i, t := range p.tensors {
		key := tie(t.Name)
		if key == "" || !(verdicts[i].candidate || verdicts[i].pinned) {
			continue
		}
		j, ok := first[key]
		if !ok {
			first[key] = i
			continue
		}
		a, b := verdicts[j], verdicts[i]
		if a.pinned != b.pinned || a.choice != b.choice {
			return fmt.Errorf("tensors %s (%s) and %s (%s) are tied (%s: one choice for all): override all of them alike or none",
				p.tensors[j].Name, pinWord(a), t.Name, pinWord(b), key)
		}
	}
	return nil
}

func pinWord(v verdict) string {
	if !v.pinned {
		return "not pinned"
	}
	return v.reason
}
