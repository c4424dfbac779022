package gptq

import "testing"

// TestCornerSlicesHaveOneOwnerEach: the top corner's slices cover its columns once, each goes to
// one solver of the team, and no solver's flops exceed another's by more than one slice's.
func TestCornerSlicesHaveOneOwnerEach(t *testing.T) {
	for _, k := range []int{4096, 11008, 28672} {
		c, ok := topCorner(k)
		if !ok {
			t.Fatalf("k %d: the top corner is not sliced", k)
		}
		next := 0
		for _, s := range c.slices {
			if s.first != next || s.width <= 0 || s.width > cornerSlice {
				t.Fatalf("k %d: slice %+v after column %d", k, s, next)
			}
			next = s.first + s.width
		}
		if next != c.n1 || c.n1+c.n2 != k {
			t.Fatalf("k %d: slices end at %d; n1 %d, n2 %d", k, next, c.n1, c.n2)
		}
		cost := func(s columnSlice) int { return s.width * (c.n2*(c.n1-s.first) + c.n2*c.n2/2) }
		for team := 1; team <= 8; team++ {
			load := make([]int, team)
			largest := 0
			for i, s := range c.slices {
				p := c.owner(i, team)
				if p < 0 || p >= team {
					t.Fatalf("k %d, team %d: slice %d owned by %d", k, team, i, p)
				}
				load[p] += cost(s)
				largest = max(largest, cost(s))
			}
			lo, hi := load[0], load[0]
			for _, l := range load {
				lo, hi = min(lo, l), max(hi, l)
			}
			if team <= len(c.slices) && hi-lo > largest {
				t.Errorf("k %d, team %d: loads %v differ by more than a slice (%d)", k, team, load, largest)
			}
		}
	}
	if _, ok := topCorner(3800); ok {
		t.Error("k 3800: a first half under slicedFrom is sliced")
	}
}
