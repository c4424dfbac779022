package gptq

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/quant"
)

// bandedKMSHessian32 is bandedKMSHessian rounded to float32, made without the float64 copy (a
// 405B's width).
func bandedKMSHessian32(k int) []float32 {
	m := newBandedKMS(k)
	h := make([]float32, k*k)
	for i := range k {
		for j := range k {
			h[i*k+j] = float32(m.at(i, j))
		}
	}
	return h
}

// factorBenchCases is BenchmarkGPUFactorShared's widths and most GPUs: QPACK_FACTOR_K and
// QPACK_FACTOR_GPUS where set.
func factorBenchCases(b *testing.B) (widths []int, most int) {
	widths, most = widthsFromEnv(b, "QPACK_FACTOR_K", 4096, 8192, 11008, 14336, 28672), 4
	if s := os.Getenv("QPACK_FACTOR_GPUS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("QPACK_FACTOR_GPUS=%q is not a number of GPUs", s)
		}
		most = n
	}
	return widths, most
}

// widthsFromEnv reads a comma-separated list of widths from the environment variable name, or
// gives the defaults when it is not set.
func widthsFromEnv(b *testing.B, name string, defaults ...int) []int {
	s := os.Getenv(name)
	if s == "" {
		return defaults
	}
	var widths []int
	for _, f := range strings.Split(s, ",") {
		k, err := strconv.Atoi(f)
		if err != nil || k < 2 {
			b.Fatalf("%s=%q: %q is not a width", name, s, f)
		}
		widths = append(widths, k)
	}
	return widths
}

// bandedKMSHessian is kmsHessian (H_ij = s_i·s_j·0.9^|i−j|, a few channels 20× larger)
// without a power per entry, fast enough for K = 14336.
func bandedKMSHessian(k int) []float64 {
	m := newBandedKMS(k)
	h := make([]float64, k*k)
	for i := range k {
		for j := range k {
			h[i*k+j] = m.at(i, j)
		}
	}
	return h
}

// bandedKMS holds bandedKMSHessian's scales s_i and powers 0.9^d.
type bandedKMS struct{ s, pow []float64 }

func newBandedKMS(k int) bandedKMS {
	m := bandedKMS{s: make([]float64, k), pow: make([]float64, k)}
	for i := range m.s {
		m.s[i] = 1 + 0.5*math.Sin(float64(i))
		if i%97 == 5 {
			m.s[i] *= 20
		}
	}
	m.pow[0] = 1
	for d := 1; d < k; d++ {
		m.pow[d] = m.pow[d-1] * 0.9
	}
	return m
}

func (m bandedKMS) at(i, j int) float64 {
	d := i - j
	if d < 0 {
		d = -d
	}
	return m.s[i] * m.s[j] * m.pow[d]
}

// BenchmarkGPUQuantize times the quantization step (int4-g128-sym, W and H already on the
// GPU, results downloaded): the host plan from diag H, the Cholesky factor and T′, the column
// kernels, the GEMMs and the loss, median of 3 after a warm-up; then one profiled run for the
// breakdown. 1024×4096 and 1024×11008 are a 7B linear's row share on four GPUs, 8192×28672 a
// 70B's down_proj.
// Run with -test.benchtime=1x; each shape prints a "TABLE" line.
func BenchmarkGPUQuantize(b *testing.B) {
	_, g := openGPUSolver(b)
	g.poison = false
	s := quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}
	for _, shape := range [][2]int{{4096, 4096}, {4096, 11008}, {4096, 14336}, {8192, 8192}, {1024, 4096}, {1024, 11008}, {8192, 28672}} {
		n, k := shape[0], shape[1]
		b.Run(fmt.Sprintf("%dx%d", n, k), func(b *testing.B) {
			w := randomWeights(rand.New(rand.NewPCG(1, 1)), n, k)
			h := bandedKMSHessian(k)
			diag := diagonal(h, k)
			if err := g.upload(slotOrig, cuda.Bytes(w)); err != nil {
				b.Fatal(err)
			}
			if err := g.upload(slotH, cuda.Bytes(h)); err != nil {
				b.Fatal(err)
			}
			times, st, ph := timeSolves(b, g, n, k, diag, s, Options{})
			b.ReportMetric(times[1].Seconds()*1e3, "ms")
			fmt.Printf("TABLE %5dx%-5d median %6.1f ms (runs %v)  cholesky %5.1f  columns %5.1f  gemms %5.1f  other %4.1f ms  loss %.6g damp %g\n",
				n, k, ms(times[1]), times, ms(ph[phaseCholesky]), ms(ph[phaseColumns]), ms(ph[phaseGEMMs]), ms(ph[phaseOther]), st.Loss, st.Damp)
		})
	}
}

func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }

// timeSolves times solveLoaded with W and H loaded in g: three runs after a warm-up, sorted,
// the last one's stats, then one profiled run's phases.
func timeSolves(b *testing.B, g *GPUSolver, n, k int, diag []float64, s quant.Scheme, opt Options) ([]time.Duration, Stats, [numPhases]time.Duration) {
	once := func() (Stats, time.Duration) {
		start := time.Now()
		st, err := solveLoaded(g, n, k, diag, s, opt)
		if err != nil {
			b.Fatal(err)
		}
		return st, time.Since(start)
	}
	once()
	var times []time.Duration
	var st Stats
	for range 3 {
		var d time.Duration
		st, d = once()
		times = append(times, d)
	}
	slices.Sort(times)
	g.profile = &gpuProfile{}
	once()
	if err := g.finishProfile(); err != nil { // (run leaves the results, and the spans, to download)
		b.Fatal(err)
	}
	ph := g.profile.phases
	g.profile = nil
	return times, st, ph
}

// solveLoaded factors the H in slotH (diagonal diag) and solves the weights in slotOrig.
func solveLoaded(g *GPUSolver, n, k int, diag []float64, s quant.Scheme, opt Options) (Stats, error) {
	f, err := factorAll([]*GPUSolver{g}, diag, k, opt, time.Now())
	if err != nil {
		return Stats{}, err
	}
	st := Stats{Damp: f[0].damp, Lambda: f[0].lambda}
	p, err := g.plan(n, k, diag, s, opt)
	if err == nil {
		_, err = g.run(p, f[0], &st)
	}
	return st, err
}

// BenchmarkGPUQuantizeSearched times a 4096×11008 int3-g128 solve (a 7B MLP projection's
// shape; groups fitted on the fly) with min-max groups, with the imatrix search (--imatrix)
// and with the MSE clip search (--clip), asymmetric and symmetric: W and H already on the GPU,
// results downloaded, median of 3 after a warm-up, then one profiled run for the breakdown
// (fit: gptq_fit_search). Each line gives the ratio to min-max's median in the same run. Run
// with -test.benchtime=1x; each case prints a "TABLE" line.
func BenchmarkGPUQuantizeSearched(b *testing.B) {
	_, g := openGPUSolver(b)
	g.poison = false
	const n, k = 4096, 11008
	w := randomWeights(rand.New(rand.NewPCG(1, 1)), n, k)
	h := bandedKMSHessian(k)
	diag := diagonal(h, k)
	if err := g.upload(slotOrig, cuda.Bytes(w)); err != nil {
		b.Fatal(err)
	}
	if err := g.upload(slotH, cuda.Bytes(h)); err != nil {
		b.Fatal(err)
	}
	for _, sym := range []bool{false, true} {
		s := quant.Scheme{Bits: 3, GroupSize: 128, Sym: sym}
		var plain time.Duration
		for _, fit := range []string{"minmax", "weighted", "mse"} {
			opt := Options{Imatrix: fit == "weighted", Clip: fit == "mse"}
			b.Run(fmt.Sprintf("%s/%s", s, fit), func(b *testing.B) {
				times, st, ph := timeSolves(b, g, n, k, diag, s, opt)
				if fit == "minmax" {
					plain = times[1]
				}
				b.ReportMetric(ms(times[1]), "ms")
				ratio := "min-max not run"
				if plain > 0 {
					ratio = fmt.Sprintf("%.2f× min-max", float64(times[1])/float64(plain))
				}
				fmt.Printf("TABLE %dx%d %-15s %-8s median %7.1f ms (runs %v, %s)  fit %6.1f  columns %5.1f  gemms %5.1f  cholesky %5.1f  other %4.1f ms  loss %.6g\n",
					n, k, s, fit, ms(times[1]), times, ratio, ms(ph[phaseFit]), ms(ph[phaseColumns]), ms(ph[phaseGEMMs]),
					ms(ph[phaseCholesky]), ms(ph[phaseOther]), st.Loss)
			})
		}
	}
}

// BenchmarkGPUQuantizeGramSetup splits QuantizeGram's setup on an 11008×4096 layer (a 7B MLP
// projection): the weight check, the upload of W through the stager, and the whole call's
// Setup as Stats reports it.
func BenchmarkGPUQuantizeGramSetup(b *testing.B) {
	dev, g := openGPUSolver(b)
	g.poison = false
	const n, k = 11008, 4096
	w := randomWeights(rand.New(rand.NewPCG(1, 1)), n, k)
	h := bandedKMSHessian(k)
	gram := make([]float32, k*k)
	for i, v := range h {
		gram[i] = float32(v)
	}
	p, err := dev.Alloc(4 * k * k)
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Free(p)
	if err := dev.CopyToDevice(p, cuda.Bytes(gram)); err != nil {
		b.Fatal(err)
	}
	s := quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}
	var check, upload, setup, total time.Duration
	for range b.N {
		start := time.Now()
		if err := checkWeights(w, n, k, s, Options{}); err != nil {
			b.Fatal(err)
		}
		check += time.Since(start)
		start = time.Now()
		if err := g.upload(slotOrig, cuda.Bytes(w)); err != nil {
			b.Fatal(err)
		}
		if err := dev.SynchronizeStream(g.stream); err != nil {
			b.Fatal(err)
		}
		upload += time.Since(start)
		_, st, err := g.QuantizeGram(w, n, k, p, 1, s, Options{BaselineLoss: true})
		if err != nil {
			b.Fatal(err)
		}
		setup += st.Setup
		total += st.Total
	}
	ms := func(d time.Duration) float64 { return 1000 * d.Seconds() / float64(b.N) }
	b.ReportMetric(ms(check), "check-ms")
	b.ReportMetric(ms(upload), "upload-ms")
	b.ReportMetric(ms(setup), "setup-ms")
	b.ReportMetric(ms(total), "total-ms")
}

// BenchmarkGPUFactorShared times FactorGramOnAll of a banded Hessian on 1, 2 and 4 GPUs (as
// many as there are, with peer access), each GPU factoring its copy whole and sharing the
// factorisation (factorShared: halves at least splitFactorMin wide, or QPACK_FACTOR_MIN, shared
// again), median of 5 after a warm-up. Run with -test.benchtime=1x; each
// case prints a "TABLE" line with the least free GPU memory seen. QPACK_FACTOR_K (widths, comma
// separated) and QPACK_FACTOR_GPUS (the most GPUs) replace the cases: QPACK_FACTOR_K=53248
// QPACK_FACTOR_GPUS=1 asks whether a 405B's down_proj factors on one 80 GB GPU.
func BenchmarkGPUFactorShared(b *testing.B) {
	widths, most := factorBenchCases(b)
	devs := gputest.OpenMany(b, most)
	if _, err := cuda.EnablePeerAccess(devs); err != nil {
		b.Fatal(err)
	}
	team := make([]*GPUSolver, len(devs))
	for i, dev := range devs {
		team[i] = newTestSolver(b, dev)
		team[i].poison = false
	}
	defer func(m int) { splitFactorMin = m }(splitFactorMin)
	split := splitFactorMin
	if v := os.Getenv("QPACK_FACTOR_MIN"); v != "" {
		var err error
		if split, err = strconv.Atoi(v); err != nil || split < 2 {
			b.Fatalf("QPACK_FACTOR_MIN=%q is not a width", v)
		}
	}
	for _, k := range widths {
		h32 := bandedKMSHessian32(k)
		grams := make([]cuda.DevicePtr, len(devs))
		for i, dev := range devs {
			grams[i] = gputest.Floats(b, dev, h32)
		}
		h32 = nil
		for _, parts := range []int{1, 2, 4} {
			if parts > most {
				continue
			}
			for _, shared := range []bool{false, true} {
				if parts == 1 && shared {
					continue
				}
				b.Run(fmt.Sprintf("k=%d/gpus=%d/shared=%v", k, parts, shared), func(b *testing.B) {
					splitFactorMin = math.MaxInt
					if shared {
						splitFactorMin = min(split, k) // shared at least once
					}
					var times []time.Duration
					leastFree := uint64(math.MaxUint64)
					for run := range 6 {
						start := time.Now()
						if _, err := FactorGramOnAll(team[:parts], grams[:parts], k, 1, Options{}); err != nil {
							b.Fatal(err)
						}
						if free, _, err := devs[0].MemoryInfo(); err == nil {
							leastFree = min(leastFree, free)
						}
						if run > 0 {
							times = append(times, time.Since(start))
						}
					}
					slices.Sort(times)
					b.ReportMetric(ms(times[2]), "ms")
					fmt.Printf("TABLE k %5d  GPUs %d  shared %-5v (%d blocks whole)  median %6.1f ms  least free on GPU 0 %.1f GB  (runs %v)\n",
						k, parts, shared, sharedLeaves(k), ms(times[2]), float64(leastFree)/1e9, times)
				})
			}
		}
	}
}

// BenchmarkGPUFirstUse times, step by step and each step synchronized, what a fresh process's
// first solver pays before its work runs at speed: making the solver, the column loop's FP32
// GEMMs (each shape's first call, then the loop again), the baseline's TF32 GEMM, the synthetic
// factorisation and solve of a conversion's warm-up (gptq.GPUSolver.WarmFactor and Warm), twice
// each. Run it alone in its process (-test.run '^$' -test.bench GPUFirstUse): it measures the
// first use of the driver's, cuBLAS's and cuSOLVER's kernels. QPACK_FIRST_N sets the rows (4096).
func BenchmarkGPUFirstUse(b *testing.B) {
	dev := gputest.Open(b)
	n, k := 4096, 4096
	if s := os.Getenv("QPACK_FIRST_N"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			b.Fatalf("QPACK_FIRST_N=%q is not a number of rows", s)
		}
	}
	var g *GPUSolver
	step := func(name string, f func() error) {
		start := time.Now()
		err := f()
		if err == nil && g != nil {
			err = dev.SynchronizeStream(g.stream)
		}
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		fmt.Printf("TABLE first use, %d×%d: %-44s %8.2f ms\n", n, k, name, 1000*time.Since(start).Seconds())
	}
	step("solver", func() (err error) { g, err = NewGPUSolver(dev); return err })
	defer g.Close()
	var w, t, diff, wh cuda.DevicePtr
	step("buffers", func() (err error) {
		for _, s := range []struct {
			p     *cuda.DevicePtr
			slot  int
			bytes int
		}{{&w, slotW, 4 * n * k}, {&t, slotT, 4 * k * k}, {&diff, slotDiff, 4 * n * gpuBlockSize}, {&wh, slotBaseWH, 4 * n * k}} {
			if *s.p, err = g.buffer(s.slot, s.bytes); err == nil {
				err = dev.Fill32Async(*s.p, 0, s.bytes/4, g.stream)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	gemm := func(i2 int) error {
		return g.blas.Sgemm(cuda.NoTrans, cuda.NoTrans, k-i2, n, gpuBlockSize, 1, t.Add(4*(i2-gpuBlockSize)*k+4*i2), k, diff, gpuBlockSize, 1, w.Add(4*i2), k)
	}
	for i2 := gpuBlockSize; i2 < k; i2 += gpuBlockSize * 8 {
		step(fmt.Sprintf("column GEMM %d×%d×%d, first", k-i2, n, gpuBlockSize), func() error { return gemm(i2) })
	}
	for round := range 2 {
		step(fmt.Sprintf("column loop's GEMMs, round %d", round), func() error {
			for i2 := gpuBlockSize; i2 < k; i2 += gpuBlockSize {
				if err := gemm(i2); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for round := range 2 {
		step(fmt.Sprintf("baseline's TF32 GEMM, round %d", round), func() error {
			err := g.blas.SetTF32(true)
			if err == nil {
				err = g.blas.Sgemm(cuda.NoTrans, cuda.NoTrans, k, n, k, 1, t, k, w, k, 0, wh, k)
			}
			if e := g.blas.SetTF32(false); err == nil {
				err = e
			}
			return err
		})
	}
	var f *Factor
	for round := range 2 {
		step(fmt.Sprintf("warm-up factorisation, round %d", round), func() (err error) { f, err = g.WarmFactor(k, Options{}); return err })
	}
	s := quant.Scheme{Bits: 4, GroupSize: 128}
	for round := range 3 {
		opt := Options{BaselineLoss: round < 2}
		step(fmt.Sprintf("warm-up solve (baseline %v), round %d", opt.BaselineLoss, round), func() error { return g.Warm(n, f, s, opt) })
	}
	// A second solver on the GPU (its own cuBLAS handle and stream): what is paid per handle.
	first := g
	step("second solver", func() (err error) { g, err = NewGPUSolver(dev); return err })
	defer g.Close()
	if err := dev.SynchronizeStream(first.stream); err != nil {
		b.Fatal(err)
	}
	t = f.t // the synthetic factor's T′, finite
	for _, s := range []struct {
		p     *cuda.DevicePtr
		slot  int
		bytes int
	}{{&w, slotW, 4 * n * k}, {&diff, slotDiff, 4 * n * gpuBlockSize}} {
		var err error
		if *s.p, err = g.buffer(s.slot, s.bytes); err == nil {
			err = dev.Fill32Async(*s.p, 0, s.bytes/4, g.stream)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	step(fmt.Sprintf("second solver: column GEMM %d×%d×%d, first", k-gpuBlockSize, n, gpuBlockSize), func() error { return gemm(gpuBlockSize) })
	step("second solver: warm-up solve (baseline true)", func() error { return g.Warm(n, f, s, Options{BaselineLoss: true}) })
	step("second solver: warm-up solve, again", func() error { return g.Warm(n, f, s, Options{BaselineLoss: true}) })
}

// BenchmarkGPUCholeskyRecursive times, on one GPU, the damped Hessian's Cholesky factorisation and
// T′ whole (cuSOLVER's potrf) against the recursion of choleskyShared on that GPU alone, split
// until the blocks are narrower than each QPACK_FACTOR_LEAF width (default 8192, 4096, 2048,
// 1024, 512): whether halves factored with DTRSM and DSYRK between them beat potrf.
func BenchmarkGPUCholeskyRecursive(b *testing.B) {
	widths, _ := factorBenchCases(b)
	leaves := widthsFromEnv(b, "QPACK_FACTOR_LEAF", 8192, 4096, 2048, 1024, 512)
	dev := gputest.Open(b)
	g := newTestSolver(b, dev)
	g.poison = false
	defer func(m int) { splitFactorMin = m }(splitFactorMin)
	for _, k := range widths {
		gram := gputest.Floats(b, dev, bandedKMSHessian32(k))
		diag, err := g.loadGram(gram, k, 1)
		if err != nil {
			b.Fatal(err)
		}
		dead, _ := deadColumns(diag)
		if err := g.prepareFactor(k, columnOrder(diag, dead, false), dead); err != nil {
			b.Fatal(err)
		}
		lambda := 0.01 * slices.Max(diag)
		for _, leaf := range append([]int{0}, leaves...) {
			if leaf >= k {
				continue
			}
			var times []time.Duration
			for run := range 6 {
				start := time.Now()
				var failed bool
				if leaf == 0 {
					failed, err = g.factor(k, lambda)
				} else {
					splitFactorMin = leaf
					var f []bool
					f, err = factorShared([]*GPUSolver{g}, k, lambda)
					failed = err == nil && f[0]
				}
				if err != nil || failed {
					b.Fatalf("k %d, leaf %d: failed %v, %v", k, leaf, failed, err)
				}
				if run > 0 {
					times = append(times, time.Since(start))
				}
			}
			slices.Sort(times)
			blocks := 1
			if leaf > 0 {
				blocks = sharedLeaves(k)
			}
			fmt.Printf("TABLE Cholesky and T′ on one GPU, k %5d  split below %5d (%3d blocks whole)  median %7.2f ms  (runs %v)\n",
				k, leaf, blocks, ms(times[2]), times)
		}
	}
}
