package model

import (
	"math"
	"strings"
	"testing"
)

func TestAddChannelStats(t *testing.T) {
	x := []float32{1, -2, 3, -0.5, 0, 4}
	sq, abs := []float64{10, 0, 0}, make([]float64, 3)
	if err := AddChannelStats(sq, abs, x, 2, 3); err != nil {
		t.Fatal(err)
	}
	wantSq, wantAbs := []float64{10 + 1 + 0.25, 4, 9 + 16}, []float64{1.5, 2, 7}
	for j := range 3 {
		if sq[j] != wantSq[j] || abs[j] != wantAbs[j] {
			t.Fatalf("channel %d: got Σx² %v, Σ|x| %v; want %v, %v", j, sq[j], abs[j], wantSq[j], wantAbs[j])
		}
	}
	if err := AddChannelStats(sq, nil, x, 2, 3); err != nil {
		t.Fatal(err)
	}
	x[4] = float32(math.Inf(1))
	err := AddChannelStats(sq, abs, x, 2, 3)
	if err == nil || !strings.Contains(err.Error(), "row 1, channel 1") {
		t.Fatalf("an infinite activation gave %v, want an error naming row 1, channel 1", err)
	}
}
