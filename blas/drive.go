package blas

import (
	"sync"
	"sync/atomic"
)

// sink receives the tiles of a product and folds them into its output.
type sink interface {
	// skip reports whether no output in rows [i0, i1) × columns [j0, j1) is wanted.
	skip(i0, i1, j0, j1 int) bool
	// tile computes the rows×cols tile at (i0, j0) from kc steps of the packed panels a and b
	// with kern; first says that these are the first steps of the sum.
	tile(kern *kernel, kc int, a, b []float32, i0, j0, rows, cols int, first bool)
}

// maxTile bounds mr·nr of every kernel (the scratch tile of an edge).
const maxTile = 14 * 32

// drive computes the product o blocked for kern (the GotoBLAS loop order) on up to workers
// goroutines: for each block of nc columns and kc steps, B's block is packed once and shared;
// the rows are cut into about equal blocks of at most mc, at least spread (per worker) tasks
// when there are enough rows, and the columns into chunks when there are too few row blocks to
// keep every worker busy; each task packs its own block of A. Every output is the sum of its
// kc-step blocks in order, whatever the number of workers.
func drive(kern *kernel, o *operands, out sink, workers, spread int) {
	mr, nr := kern.mr, kern.nr
	rowPanels := ceilDiv(o.m, mr)
	blocks := min(rowPanels, roundUp(ceilDiv(o.m, kern.mc), max(workers*spread, 1)))
	if workers <= 1 {
		blocks = ceilDiv(o.m, kern.mc)
	}
	aSize := ceilDiv(rowPanels, blocks) * mr * kern.kc
	aBufs := make([][]float32, workers)
	for jc := 0; jc < o.n; jc += kern.nc {
		ncur := min(kern.nc, o.n-jc)
		panels := ceilDiv(ncur, nr)
		chunks := columnChunks(blocks, panels, workers)
		for pc := 0; pc < o.k; pc += kern.kc {
			kcur := min(kern.kc, o.k-pc)
			first := pc == 0
			bBuf := getScratch(panels * nr * kcur)
			packChunks := min(panels, 4*workers)
			parallelFor(workers, packChunks, func(_, c int) {
				q0, q1 := c*panels/packChunks, (c+1)*panels/packChunks
				if q0 < q1 {
					o.packB(bBuf[q0*nr*kcur:], jc+q0*nr, min(q1*nr, ncur)-q0*nr, pc, kcur, nr)
				}
			})
			parallelFor(workers, blocks*chunks, func(w, t int) {
				i0 := (t / chunks) * rowPanels / blocks * mr
				i1 := min(((t/chunks)+1)*rowPanels/blocks*mr, o.m)
				c := t % chunks
				q0, q1 := c*panels/chunks, (c+1)*panels/chunks
				if i0 >= i1 || q0 == q1 || out.skip(i0, i1, jc+q0*nr, jc+min(q1*nr, ncur)) {
					return
				}
				if aBufs[w] == nil {
					aBufs[w] = getScratch(aSize)
				}
				a := aBufs[w]
				o.packA(a, i0, i1-i0, pc, kcur, mr)
				for q := q0; q < q1; q++ {
					j0 := jc + q*nr
					cols := min(nr, jc+ncur-j0)
					b := bBuf[q*nr*kcur : (q+1)*nr*kcur]
					for ip := 0; i0+ip*mr < i1; ip++ {
						i, r := i0+ip*mr, min(mr, i1-i0-ip*mr)
						if !out.skip(i, i+r, j0, j0+cols) {
							out.tile(kern, kcur, a[ip*mr*kcur:(ip+1)*mr*kcur], b, i, j0, r, cols, first)
						}
					}
				}
			})
			putScratch(bBuf)
		}
	}
	for _, a := range aBufs {
		if a != nil {
			putScratch(a)
		}
	}
}

// columnChunks is how many column chunks each block of rows is cut into: one when there are at
// least as many row blocks as workers, else enough for about two tasks per worker, each chunk at
// least four panels wide so that packing A stays cheap next to the products.
func columnChunks(blocks, panels, workers int) int {
	if blocks >= workers {
		return 1
	}
	return max(1, min(ceilDiv(2*workers, blocks), panels/4))
}

func roundUp(a, b int) int { return ceilDiv(a, b) * b }

// parallelFor runs fn(worker, i) for i in [0, count) on up to workers goroutines, handing the
// indices out one at a time; worker numbers the goroutine (0 ≤ worker < workers).
func parallelFor(workers, count int, fn func(worker, i int)) {
	workers = min(workers, count)
	if workers <= 1 {
		for i := range count {
			fn(0, i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= count {
					return
				}
				fn(w, i)
			}
		})
	}
	wg.Wait()
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// scratch recycles packing buffers between products.
var scratch sync.Pool

// getScratch returns a buffer of n float32 (contents undefined).
func getScratch(n int) []float32 {
	if p, ok := scratch.Get().(*[]float32); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]float32, n)
}

func putScratch(s []float32) { scratch.Put(&s) }
