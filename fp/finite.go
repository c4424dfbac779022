package fp

import (
	"math"
	"runtime"
	"sync"
)

// FirstNonFinite returns the index of the first NaN or ±Inf in v, or −1 when every value is
// finite. Large slices are scanned by several goroutines (a 7B MLP weight is 45M values).
func FirstNonFinite(v []float32) int {
	const perWorker = 1 << 20
	workers := min(runtime.GOMAXPROCS(0), (len(v)+perWorker-1)/perWorker)
	if workers <= 1 {
		return firstNonFinite(v, 0)
	}
	size := (len(v) + workers - 1) / workers
	found := make([]int, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := min(w*size, len(v)), min((w+1)*size, len(v))
		wg.Go(func() { found[w] = firstNonFinite(v[lo:hi], lo) })
	}
	wg.Wait()
	for _, i := range found {
		if i >= 0 {
			return i
		}
	}
	return -1
}

// firstNonFinite scans v, whose first element has index offset, by the exponent bits: all
// ones means NaN or ±Inf.
func firstNonFinite(v []float32, offset int) int {
	for i, x := range v {
		if math.Float32bits(x)&0x7f800000 == 0x7f800000 {
			return offset + i
		}
	}
	return -1
}
