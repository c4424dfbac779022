// Package shares splits work among several GPUs or goroutines in contiguous parts: equal counts
// of things, or bands of a triangular matrix's columns holding equal areas.
package shares

import (
	"math"
	"sync"
)

// Runs splits [0, n) into workers contiguous runs and calls run on each from its own goroutine;
// it returns the error of the lowest failing run.
func Runs(n, workers int, run func(lo, hi int) error) error {
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() { errs[w] = run(w*n/workers, (w+1)*n/workers) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Even splits n things (sequences, rows) into parts contiguous shares whose sizes differ by at
// most one: share i is [at[i], at[i+1]).
func Even(n, parts int) (at []int) {
	at = make([]int, parts+1)
	for i := range parts {
		at[i+1] = at[i] + n/parts
		if i < n%parts {
			at[i+1]++
		}
	}
	return at
}

// Upper splits the k columns of an upper triangle (column j holds j+1 values) into parts
// contiguous bands of about equal area: band i is columns [at[i], at[i+1]).
func Upper(k, parts int) (at []int) {
	at = make([]int, parts+1)
	area := float64(k) * float64(k+1) / 2
	for i := 1; i < parts; i++ {
		// the b with b(b+1)/2 = i/parts of the area
		b := int(math.Round((math.Sqrt(1+8*area*float64(i)/float64(parts)) - 1) / 2))
		at[i] = min(max(b, at[i-1]), k)
	}
	at[parts] = k
	return at
}

// Lower is Upper for a lower triangle (column j holds k−j values).
func Lower(k, parts int) (at []int) {
	up := Upper(k, parts)
	at = make([]int, parts+1)
	for i := range at {
		at[i] = k - up[parts-i]
	}
	return at
}
