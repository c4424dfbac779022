package gptq

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// randomWeights returns W[n, k] with normal entries and a few heavier rows.
func randomWeights(r *rand.Rand, n, k int) []float32 {
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.02)
		if i/k%17 == 3 {
			w[i] *= 4
		}
	}
	return w
}

// correlatedActivations returns tokens×k inputs: neighbouring channels share a common factor,
// every token has a shared component, and a few channels are 20× larger (outlier channels).
func correlatedActivations(r *rand.Rand, tokens, k int) []float32 {
	x := make([]float32, tokens*k)
	for t := range tokens {
		common := r.NormFloat64()
		prev := r.NormFloat64()
		for c := range k {
			z := r.NormFloat64()
			v := 0.6*z + 0.5*prev + 0.3*common
			prev = z
			if c%97 == 5 {
				v *= 20
			}
			x[t*k+c] = float32(v)
		}
	}
	return x
}

// testHessian builds the Hessian of 2k correlated tokens through Hessian.Add in batches.
func testHessian(t testing.TB, r *rand.Rand, k int) []float64 {
	t.Helper()
	tokens := 2 * k
	x := correlatedActivations(r, tokens, k)
	h := NewHessian(k)
	for lo := 0; lo < tokens; lo += 300 {
		hi := min(lo+300, tokens)
		if err := h.Add(x[lo*k:hi*k], hi-lo, k); err != nil {
			t.Fatal(err)
		}
	}
	return h.Matrix()
}

// proxyLoss is tr(ΔW H ΔWᵀ) computed directly, with ΔW = W − Q (dead columns of W as zero),
// through baselineLoss (float32 products, float64 sums: within 1e-6 of the float64 form, and
// the tests' tolerances are 1e-5 and more).
func proxyLoss(w []float32, q []float32, n, k int, h []float64) float64 {
	dead := make([]bool, k)
	for c := range k {
		dead[c] = h[c*k+c] == 0
	}
	d := make([]float32, n*k)
	for i, v := range w[:n*k] {
		d[i] = v - q[i]
	}
	// A dead column's row and column of H are zero: its ΔW adds nothing, whatever Q holds there.
	return baselineLoss(d, n, k, h, dead)
}

func relDiff(a, b float64) float64 {
	if a == b {
		return 0
	}
	return math.Abs(a-b) / max(math.Abs(a), math.Abs(b))
}

type variant struct {
	name string
	s    quant.Scheme
	opt  Options
}

// variants lists the schemes and options the acceptance tests run.
func variants() []variant {
	var vs []variant
	for _, bits := range []int{2, 3, 4, 8} {
		for _, sym := range []bool{true, false} {
			for _, gs := range []int{32, 128, quant.PerChannel} {
				s := quant.Scheme{Bits: bits, GroupSize: gs, Sym: sym}
				vs = append(vs, variant{s.String(), s, Options{}})
				vs = append(vs, variant{s.String() + "-act", s, Options{ActOrder: true}})
				if gs != quant.PerChannel {
					vs = append(vs, variant{s.String() + "-act-static", s, Options{ActOrder: true, StaticGroups: true}})
				}
			}
		}
	}
	for _, s := range []quant.Scheme{{Bits: 5, GroupSize: 32, Sym: true}, {Bits: 6, GroupSize: 128}, {Bits: 7, GroupSize: quant.PerChannel}} {
		vs = append(vs, variant{s.String(), s, Options{}}) // the widths only format qpack holds
	}
	for _, gs := range []int{64, quant.PerChannel} {
		s := quant.Scheme{Grid: quant.NF4, Bits: 4, GroupSize: gs, Sym: true}
		vs = append(vs, variant{s.String(), s, Options{}}, variant{s.String() + "-act", s, Options{ActOrder: true}})
	}
	s := quant.Scheme{Bits: 4, GroupSize: 128}
	vs = append(vs, variant{s.String() + "-mse", s, Options{Clip: true}})
	s = quant.Scheme{Bits: 3, GroupSize: 32, Sym: true}
	vs = append(vs, variant{s.String() + "-act-mse", s, Options{Clip: true, ActOrder: true}})
	return vs
}

// quadraticForm returns tr(W H Wᵀ) = Σ_r w_r H w_rᵀ in float64 (dead columns of W as zero),
// rows split over GOMAXPROCS goroutines: the reference of baselineLoss and of the GPU's.
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
