package gptq

import (
	"runtime"
	"sync"

	"github.com/qpack-dev/qpack/quant"
)

// squaredError returns ‖W − Q‖²_F in float64, with dead columns of W counted as zero.
func squaredError(t *quant.Tensor, w []float32, dead []bool) float64 {
	q := t.Dequantize(nil)
	sum := 0.0
	for i, v := range w {
		if dead[i%t.K] {
			v = 0
		}
		d := float64(v) - float64(q[i])
		sum += d * d
	}
	return sum
}

// quadraticForm returns tr(W H Wᵀ) = Σ_r w_r H w_rᵀ in float64 (dead columns of W as zero),
// rows split over GOMAXPROCS goroutines.
func quadraticForm(w []float32, n, k int, h []float64, dead []bool) float64 {
	workers := min(runtime.GOMAXPROCS(0), n)
	sums := make([]float64, workers)
	var wg sync.WaitGroup
	for p := range workers {
		wg.Go(func() {
			row := make([]float64, k)
			for r := p * n / workers; r < (p+1)*n/workers; r++ {
				for c := range k {
					row[c] = float64(w[r*k+c])
					if dead[c] {
						row[c] = 0
					}
				}
				for i, x := range row {
					if x == 0 {
						continue
					}
					dot := 0.0
					for j, y := range h[i*k : (i+1)*k] {
						dot += y * row[j]
					}
					sums[p] += x * dot
				}
			}
		})
	}
	wg.Wait()
	total := 0.0
	for _, s := range sums {
		total += s
	}
	return total
}
