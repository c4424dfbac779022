package shares

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
)

func TestEven(t *testing.T) {
	for _, c := range []struct {
		n, parts int
		want     []int
	}{
		{8, 1, []int{0, 8}}, {8, 2, []int{0, 4, 8}}, {10, 4, []int{0, 3, 6, 8, 10}}, {3, 3, []int{0, 1, 2, 3}},
	} {
		if got := Even(c.n, c.parts); !slices.Equal(got, c.want) {
			t.Errorf("Even(%d, %d) = %v, want %v", c.n, c.parts, got, c.want)
		}
	}
}

// TestTriangleBands: the bands of a triangle's columns cover them in order, and for triangles
// wide enough hold about equal areas (within one column's).
func TestTriangleBands(t *testing.T) {
	for _, k := range []int{1, 2, 7, 300, 4096, 11008} {
		for _, parts := range []int{1, 2, 3, 4, 8} {
			for _, c := range []struct {
				name   string
				bands  func(k, parts int) []int
				column func(j int) int // values in column j
			}{{"upper", Upper, func(j int) int { return j + 1 }}, {"lower", Lower, func(j int) int { return k - j }}} {
				at := c.bands(k, parts)
				if len(at) != parts+1 || at[0] != 0 || at[parts] != k {
					t.Fatalf("%s, k=%d, %d parts: %v", c.name, k, parts, at)
				}
				mean := float64(k) * float64(k+1) / 2 / float64(parts)
				for i := range parts {
					if at[i+1] < at[i] {
						t.Fatalf("%s, k=%d, %d parts: not in order: %v", c.name, k, parts, at)
					}
					area := 0
					for j := at[i]; j < at[i+1]; j++ {
						area += c.column(j)
					}
					if k >= 64*parts && math.Abs(float64(area)-mean) > float64(k) {
						t.Errorf("%s, k=%d, %d parts: band %d holds %d values, the mean is %.0f: %v", c.name, k, parts, i, area, mean, at)
					}
				}
			}
		}
	}
}

// TestRuns: the runs cover [0, n) once, contiguously, and the lowest failing run's error comes back.
func TestRuns(t *testing.T) {
	seen := make([]int, 10)
	var mu sync.Mutex
	err := Runs(10, 3, func(lo, hi int) error {
		mu.Lock()
		defer mu.Unlock()
		for i := lo; i < hi; i++ {
			seen[i]++
		}
		if lo > 0 {
			return fmt.Errorf("run from %d", lo)
		}
		return nil
	})
	if err == nil || err.Error() != "run from 3" {
		t.Errorf("error %v, want the run from 3's", err)
	}
	for i, c := range seen {
		if c != 1 {
			t.Errorf("%d visited %d times", i, c)
		}
	}
}
