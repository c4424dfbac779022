package gptq

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/quant"
)

// TestGPUFactorMatchesCPU: T′ from the GPU's Cholesky factor (dead columns, act-order) equals
// the CPU's columnFactor within float64 rounding, entry by entry.
func TestGPUFactorMatchesCPU(t *testing.T) {
	dev, g := openGPUSolver(t)
	for _, k := range []int{700, 1900, 2600} {
		h := bandedKMSHessian(k)
		killColumns(h, k, 3, k-2)
		h32 := make([]float32, k*k)
		for i, v := range h {
			h32[i] = float32(v)
			h[i] = float64(h32[i]) // what the GPU gets
		}
		for _, opt := range []Options{{}, {ActOrder: true}} {
			f, err := g.FactorGram(gputest.Floats(t, dev, h32), k, 1, opt)
			if err != nil {
				t.Fatal(err)
			}
			got := download(t, dev, f.t, k*k)
			dead, _ := deadColumns(diagonal(h, k))
			var st Stats
			want, err := columnFactor(new(Workspace), h, k, columnOrder(diagonal(h, k), dead, opt.ActOrder), dead, opt.withDefaults(), &st)
			if err != nil {
				t.Fatal(err)
			}
			largest := 0.0
			for _, v := range want {
				largest = max(largest, math.Abs(float64(v)))
			}
			bad := 0
			for i, v := range want {
				if d := math.Abs(float64(got[i]) - float64(v)); d > 1e-6*largest+1e-5*math.Abs(float64(v)) {
					if bad++; bad <= 3 {
						t.Errorf("k %d, %+v: T′[%d][%d] = %g on the GPU, %g on the CPU", k, opt, i/k, i%k, got[i], v)
					}
				}
			}
			if st.Damp != f.damp {
				t.Errorf("k %d: damping %g on the GPU, %g on the CPU", k, f.damp, st.Damp)
			}
		}
	}
}

// TestGPUFactorOnSeveralGPUs: factored on 2, 3 and 4 solvers at once (on as many GPUs as there
// are, round-robin), every solver's T′ and float32 H are one solver's bit for bit, damping
// retries included, and solves with any of them give one solver's tensor. Fresh random inputs.
func TestGPUFactorOnSeveralGPUs(t *testing.T) {
	devs := gputest.OpenMany(t, 4)
	team := make([]*GPUSolver, len(devs))
	for i, dev := range devs {
		team[i] = newTestSolver(t, dev)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 17))
	const n, k = 70, 1100
	s := quant.Scheme{Bits: 4, GroupSize: 128}
	opt := Options{ActOrder: true, BaselineLoss: true}
	w := randomWeights(r, n, k)
	for _, c := range []struct {
		name    string
		h       []float64
		retries int
	}{{"random", testHessian(t, r, k), 0}, {"indefinite", indefiniteHessian(k, 1.05), 1}} {
		h32 := make([]float32, k*k)
		for i, v := range c.h {
			h32[i] = float32(v)
		}
		grams := make([]cuda.DevicePtr, len(devs))
		for i, dev := range devs {
			grams[i] = gputest.Floats(t, dev, h32)
		}
		one, err := team[0].FactorGram(grams[0], k, 1, opt)
		if err != nil {
			t.Fatal(err)
		}
		if one.retries != c.retries {
			t.Errorf("%s: %d retries, want %d", c.name, one.retries, c.retries)
		}
		wantT, wantH := download(t, devs[0], one.t, k*k), download(t, devs[0], one.h32, k*k)
		want, wst, err := team[0].QuantizeFactored(nil, 0, w, 0, n, one, s, opt)
		if err != nil {
			t.Fatal(err)
		}
		for parts := 2; parts <= len(team); parts++ {
			factors, err := FactorGramOnAll(team[:parts], grams[:parts], k, 1, opt)
			if err != nil {
				t.Fatal(err)
			}
			for i, f := range factors {
				if f.retries != c.retries || f.damp != one.damp {
					t.Errorf("%s, %d parts, solver %d: %d retries, damping %g; want %d, %g", c.name, parts, i, f.retries, f.damp, c.retries, one.damp)
				}
				if !slices.Equal(download(t, devs[i], f.t, k*k), wantT) || !slices.Equal(download(t, devs[i], f.h32, k*k), wantH) {
					t.Errorf("%s, %d parts, solver %d: T′ or H differs from one solver's", c.name, parts, i)
				}
				got, gst, err := team[i].QuantizeFactored(nil, 0, w, 0, n, f, s, opt)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got.Codes, want.Codes) || !slices.Equal(got.Scales, want.Scales) || !slices.Equal(got.GIdx, want.GIdx) ||
					gst.Loss != wst.Loss || gst.Baseline != wst.Baseline {
					t.Errorf("%s, %d parts, solver %d: the solve differs from one solver's", c.name, parts, i)
				}
			}
		}
	}
}

// TestGPUFactorSharedAmongGPUs: with the factorisation shared among 2, 3 and 4 solvers
// (factorShared; on as many GPUs as there are, with peer access, or several on one), its halves
// factored whole or shared again down to eighths (choleskyShared), every
// solver's T′ is the others' bit for bit and one solver's whole factorisation's within float64
// rounding (dead columns, act-order, odd widths), damping retries are decided as one solver
// decides them, and solves with any of the factors give the same tensor. Fresh random inputs.
func TestGPUFactorSharedAmongGPUs(t *testing.T) {
	defer func(m int) { splitFactorMin = m }(splitFactorMin)
	splitFactorMin = 1
	devs := gputest.OpenMany(t, 4)
	if _, err := cuda.EnablePeerAccess(devs); err != nil {
		t.Fatal(err)
	}
	team := make([]*GPUSolver, len(devs))
	for i, dev := range devs {
		team[i] = newTestSolver(t, dev)
	}
	if !sharesFactor(team, 2) {
		t.Skip("the GPUs do not all reach each other's memory")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 23))
	const n = 50
	s := quant.Scheme{Bits: 4, GroupSize: 64}
	banded := bandedKMSHessian(1301)
	killColumns(banded, 1301, 5, 1000)
	for _, c := range []struct {
		name    string
		k       int
		h       []float64
		opt     Options
		retries int
	}{
		{"random", 701, testHessian(t, r, 701), Options{}, 0},
		{"banded, dead columns, act-order", 1301, banded, Options{ActOrder: true}, 0},
		{"indefinite", 640, indefiniteHessian(640, 1.05), Options{}, 1},
	} {
		k := c.k
		h32 := make([]float32, k*k)
		for i, v := range c.h {
			h32[i] = float32(v)
			c.h[i] = float64(h32[i]) // what the GPUs get
		}
		w := randomWeights(r, n, k)
		grams := make([]cuda.DevicePtr, len(devs))
		for i, dev := range devs {
			grams[i] = gputest.Floats(t, dev, h32)
		}
		whole, err := team[0].FactorGram(grams[0], k, 1, c.opt) // one solver: not shared
		if err != nil {
			t.Fatal(err)
		}
		if whole.retries != c.retries {
			t.Errorf("%s: %d retries on one solver, want %d", c.name, whole.retries, c.retries)
		}
		want := download(t, devs[0], whole.t, k*k) // TestGPUFactorMatchesCPU checks it against the CPU
		largest := 0.0
		for _, v := range want {
			largest = max(largest, math.Abs(float64(v)))
		}
		for try := 0; try < 2*(len(team)-1); try++ {
			parts, levels := 2+try/2, 1+2*(try%2) // halves factored whole, or eighths
			splitFactorMin = (k-1)>>levels + 2    // one more than the widest block at that depth
			if sharedLeaves(k) != 1<<levels {
				t.Fatalf("%s: %d leaves at %d levels", c.name, sharedLeaves(k), levels)
			}
			what := fmt.Sprintf("%s, %d parts, %d levels", c.name, parts, levels)
			factors, err := FactorGramOnAll(team[:parts], grams[:parts], k, 1, c.opt)
			splitFactorMin = 1
			if err != nil {
				t.Fatal(err)
			}
			first := download(t, devs[0], factors[0].t, k*k)
			bad := 0
			for i, v := range want {
				if d := math.Abs(float64(first[i]) - float64(v)); d > 1e-6*largest+1e-5*math.Abs(float64(v)) {
					if bad++; bad <= 3 {
						t.Errorf("%s: T′[%d][%d] = %g shared, %g whole", what, i/k, i%k, first[i], v)
					}
				}
			}
			solved, _, err := team[0].QuantizeFactored(nil, 0, w, 0, n, factors[0], s, c.opt)
			if err != nil {
				t.Fatal(err)
			}
			for i, f := range factors {
				if f.retries != whole.retries || f.damp != whole.damp {
					t.Errorf("%s, solver %d: %d retries, damping %g; one solver's %d, %g", what, i, f.retries, f.damp, whole.retries, whole.damp)
				}
				if i == 0 {
					continue
				}
				if !slices.Equal(download(t, devs[i], f.t, k*k), first) {
					t.Errorf("%s: solver %d's T′ differs from solver 0's", what, i)
				}
				got, _, err := team[i].QuantizeFactored(nil, 0, w, 0, n, f, s, c.opt)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got.Codes, solved.Codes) || !slices.Equal(got.Scales, solved.Scales) {
					t.Errorf("%s: solver %d's solve differs from solver 0's", what, i)
				}
			}
		}
	}
}

// TestGPUFactorSharedBySolvers: solvers of one GPU solving different weights with one factor at
// once (q, k and v) each give what QuantizeGram gives alone; stale or mismatched factors are
// refused.
func TestGPUFactorSharedBySolvers(t *testing.T) {
	dev, g := openGPUSolver(t)
	others := []*GPUSolver{newTestSolver(t, dev), newTestSolver(t, dev), newTestSolver(t, dev)}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 19))
	const n, k = 90, 700
	h := testHessian(t, r, k)
	h32 := make([]float32, k*k)
	for i, v := range h {
		h32[i] = float32(v)
	}
	gram := gputest.Floats(t, dev, h32)
	s := quant.Scheme{Bits: 3, GroupSize: 64}
	opt := Options{BaselineLoss: true}
	ws := make([][]float32, len(others))
	want := make([]*quant.Tensor, len(others))
	for i := range ws {
		ws[i] = randomWeights(r, n, k)
		var err error
		if want[i], _, err = g.QuantizeGram(ws[i], n, k, gram, 1, s, opt); err != nil {
			t.Fatal(err)
		}
	}
	f, err := g.FactorGram(gram, k, 1, opt)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	got := make([]*quant.Tensor, len(others))
	errs := make([]error, len(others))
	for i, o := range others {
		wg.Go(func() { got[i], _, errs[i] = o.QuantizeFactored(nil, 0, ws[i], 0, n, f, s, opt) })
	}
	wg.Wait()
	for i := range others {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if !slices.Equal(got[i].Codes, want[i].Codes) || !slices.Equal(got[i].Scales, want[i].Scales) || !slices.Equal(got[i].Zeros, want[i].Zeros) {
			t.Errorf("solver %d's solve with the shared factor differs from QuantizeGram's", i)
		}
	}
	if _, _, err := others[0].QuantizeFactored(nil, 0, ws[0], 0, n, f, s, Options{Damp: 0.1}); err == nil || !strings.Contains(err.Error(), "damping") {
		t.Errorf("a factor of damping 0.01 used with 0.1: %v", err)
	}
	if _, err := g.FactorGram(gram, k, 1, opt); err != nil {
		t.Fatal(err)
	}
	if _, _, err := others[0].QuantizeFactored(nil, 0, ws[0], 0, n, f, s, opt); err == nil || !strings.Contains(err.Error(), "gone") {
		t.Errorf("a factor whose solver factored again: %v", err)
	}
}

// download copies count float32 from dev at p.
func download(t *testing.T, dev *cuda.Device, p cuda.DevicePtr, count int) []float32 {
	t.Helper()
	v := make([]float32, count)
	if err := dev.CopyFromDevice(cuda.Bytes(v), p); err != nil {
		t.Fatal(err)
	}
	return v
}
