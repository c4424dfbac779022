package fp

import (
	"math"
	"runtime"
	"sync"
	"unsafe"
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
// ones means NaN or ±Inf. Eight values at a time, as four 64-bit words of two: with
// x = bits&exp ^ exp, a value is not finite exactly where its 32-bit half of x is zero, and
// (x − low) &^ x & high finds a zero half (halves of x stay below 2^31, so nothing else sets
// their top bit); the eight that hold one are then scanned one by one.
func firstNonFinite(v []float32, offset int) int {
	const exp, low, high = 0x7f800000_7f800000, 0x00000001_00000001, 0x80000000_80000000
	i := 0
	for ; i < len(v) && uintptr(unsafe.Pointer(&v[i]))%8 != 0; i++ { // words start aligned
		if nonFinite(v[i]) {
			return offset + i
		}
	}
	if rest := len(v) - i; rest >= 8 {
		words := unsafe.Slice((*uint64)(unsafe.Pointer(&v[i])), rest/2)
		for ; len(words) >= 4; words, i = words[4:], i+8 {
			a, b, c, d := words[0]&exp^exp, words[1]&exp^exp, words[2]&exp^exp, words[3]&exp^exp
			if ((a-low)&^a|(b-low)&^b|(c-low)&^c|(d-low)&^d)&high != 0 {
				break
			}
		}
	}
	for ; i < len(v); i++ {
		if nonFinite(v[i]) {
			return offset + i
		}
	}
	return -1
}

func nonFinite(x float32) bool { return math.Float32bits(x)&0x7f800000 == 0x7f800000 }
