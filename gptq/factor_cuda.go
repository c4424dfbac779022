package gptq

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/cuda"
)

// Factor is what GPTQ's column loop needs of one Hessian on one GPU, made once and read by
// every solve with that Hessian there (q, k and v share their input's; so do a linear's row
// shares): T′ of (H + λI) in the column order (columnFactor), and H rounded to float32 (for the
// baseline loss), both K×K on the device in the buffers of the solver that made it, with what
// the host decided from diag H. Solves only read it, so several solvers of
// its GPU may use it at once; it stays valid until its maker factors again or closes.
type Factor struct {
	maker       *GPUSolver
	generation  uint64 // the maker's factorisations when it was made
	k           int
	opt         Options // with defaults: the damping and column order it was made for
	diag        []float64
	t, h32      cuda.DevicePtr
	damp        float64 // the damping that factored, λ = damp·meanDiag
	lambda      float64
	retries     int
	failedDamps []float64
	elapsed     time.Duration
}

// FactorGram makes the Factor of H = scale·gram (gram a k×k float32 Gram matrix on g's device,
// as the calibration gathers it) for solves with options opt. H is made in float64 there; only
// its diagonal comes to the host.
func (g *GPUSolver) FactorGram(gram cuda.DevicePtr, k int, scale float64, opt Options) (*Factor, error) {
	f, err := FactorGramOnAll([]*GPUSolver{g}, []cuda.DevicePtr{gram}, k, scale, opt)
	if err != nil {
		return nil, err
	}
	return f[0], nil
}

// FactorGramOnAll is FactorGram for the same H on several GPUs at once (solvers[i] with its copy
// grams[i], the same bytes on each), each GPU factoring its copy while the others do: the
// factors are the same, bit for bit, and the retries with more damping are decided together.
func FactorGramOnAll(solvers []*GPUSolver, grams []cuda.DevicePtr, k int, scale float64, opt Options) ([]*Factor, error) {
	if len(solvers) == 0 || len(grams) != len(solvers) {
		return nil, fmt.Errorf("gptq: %d solvers for %d Gram matrices", len(solvers), len(grams))
	}
	start := time.Now()
	for _, g := range solvers {
		g.settle() // a solve's results may still be coming down through its stream and pinned buffer
	}
	diags := make([][]float64, len(solvers))
	err := eachSolver(solvers, func(i int, g *GPUSolver) (err error) {
		defer g.mark("scale H")()
		diags[i], err = g.loadGram(grams[i], k, scale)
		return err
	})
	if err != nil {
		return nil, err
	}
	for i, d := range diags[1:] {
		if !slices.Equal(d, diags[0]) {
			return nil, fmt.Errorf("gptq: the Hessian's diagonal on GPU %d differs from GPU 0's", i+1)
		}
	}
	return factorAll(solvers, diags[0], k, opt, start)
}

// eachSolver runs f for every solver at once and returns the errors joined.
func eachSolver(solvers []*GPUSolver, f func(i int, g *GPUSolver) error) error {
	var all sync.WaitGroup
	errs := make([]error, len(solvers))
	for i, g := range solvers {
		all.Go(func() { errs[i] = f(i, g) })
	}
	all.Wait()
	return errors.Join(errs...)
}

// factorAll makes the factors of the H in each solver's slotH, whose diagonal is diag: each
// solver builds J·P·(H + λI)·Pᵀ·J, its Cholesky factor L and T′ from T = J·L·J; the damping
// grows tenfold, up to MaxDamp, while the factorisation fails or T′ is not usable.
func factorAll(solvers []*GPUSolver, diag []float64, k int, opt Options, start time.Time) ([]*Factor, error) {
	opt = opt.withDefaults()
	dead, _ := deadColumns(diag)
	perm := columnOrder(diag, dead, opt.ActOrder)
	meanDiag := 0.0
	for i := range k {
		meanDiag += diagFixed(diag[i], dead[i])
	}
	meanDiag /= float64(k)
	if err := eachSolver(solvers, func(_ int, g *GPUSolver) error { return g.prepareFactor(k, perm, dead) }); err != nil {
		return nil, err
	}
	f := &Factor{k: k, opt: opt, diag: diag}
	for f.damp = opt.Damp; ; f.damp *= 10 {
		f.lambda = f.damp * meanDiag
		failed := make([]bool, len(solvers))
		err := eachSolver(solvers, func(i int, g *GPUSolver) (err error) {
			defer g.mark("Cholesky")()
			failed[i], err = g.factor(k, f.lambda)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("gptq: Cholesky factor: %w", err)
		}
		if !slices.Contains(failed, true) {
			break
		}
		f.retries++
		f.failedDamps = append(f.failedDamps, f.damp)
		if f.damp*10 > opt.MaxDamp*(1+1e-9) {
			return nil, fmt.Errorf("gptq: the Hessian is not positive definite even with damping %g (λ = %g, mean diag %g); %d tries",
				f.damp, f.lambda, meanDiag, f.retries)
		}
	}
	factors := make([]*Factor, len(solvers))
	err := eachSolver(solvers, func(i int, g *GPUSolver) error {
		defer g.mark("H in float32")()
		// H in float32 for the baseline loss
		err := g.fn.narrow.Launch(cuda.Dim3{X: (k*k + 255) / 256, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream,
			g.bufs[slotH].ptr, g.bufs[slotH32].ptr, uint64(k*k))
		if err == nil {
			err = g.dev.SynchronizeStream(g.stream)
		}
		g.generation++
		c := *f
		c.maker, c.generation, c.t, c.h32 = g, g.generation, g.bufs[slotT].ptr, g.bufs[slotH32].ptr
		c.elapsed = time.Since(start)
		factors[i] = &c
		return err
	})
	if err != nil {
		return nil, err
	}
	return factors, finishProfiles(solvers)
}

// finishProfiles folds the solvers' profiled spans in.
func finishProfiles(solvers []*GPUSolver) error {
	var errs []error
	for _, g := range solvers {
		errs = append(errs, g.finishProfile())
	}
	return errors.Join(errs...)
}

// prepareFactor sizes the factorisation's buffers and uploads the reversed column order and
// the dead columns that gptq_build_factor reads.
func (g *GPUSolver) prepareFactor(k int, perm []int, dead []bool) error {
	for slot, size := range map[int]int{slotFactor: 8 * k * k, slotH32: 4 * k * k, slotT: 4 * k * k, slotFlags: 32} {
		if _, err := g.buffer(slot, size); err != nil {
			return err
		}
	}
	if g.poison { // tests: what the factorisation does not write must not be read
		for _, slot := range []int{slotFactor, slotH32, slotT} {
			if err := g.dev.Fill32Async(g.bufs[slot].ptr, 0x7fc0dead, g.bufs[slot].size/4, g.stream); err != nil {
				return err
			}
		}
	}
	rev := make([]int, k)
	mask := make([]byte, k)
	for i, c := range perm {
		rev[k-1-i] = c
		if dead[c] {
			mask[c] = 1
		}
	}
	if err := g.upload(slotRev, cuda.Bytes(int32s(rev))); err != nil {
		return err
	}
	return g.upload(slotDead, mask)
}

// factor builds the damped matrix, factors it (L, cuSOLVER's potrf in float64) and writes T′
// (float32, row-major, zero below the diagonal) into slotT. It reports whether the
// factorisation failed: H + λI not positive definite, or T′ with an entry not finite or a
// diagonal entry not positive.
func (g *GPUSolver) factor(k int, lambda float64) (failed bool, err error) {
	tiles := cuda.Dim3{X: (k + 31) / 32, Y: (k + 7) / 8, Z: 1}
	block := cuda.Dim3{X: 32, Y: 8, Z: 1}
	factor, info := g.bufs[slotFactor].ptr, g.bufs[slotFlags].ptr.Add(8) // potrf's info, then T′'s flag
	end := g.span(phaseCholesky)
	err = g.dev.Fill32Async(info, 0, 2, g.stream)
	if err == nil {
		err = g.fn.buildFactor.Launch(tiles, block, 0, g.stream, g.bufs[slotH].ptr, g.bufs[slotRev].ptr, g.bufs[slotDead].ptr, int32(k), lambda, factor)
	}
	if err == nil {
		err = g.solver.Potrf(cuda.Lower, k, cuda.Float64, factor, k, info)
	}
	if err == nil {
		square := cuda.Dim3{X: (k + 31) / 32, Y: (k + 31) / 32, Z: 1} // 32×32 tiles
		err = g.fn.unreverse.Launch(square, cuda.Dim3{X: 32, Y: 8, Z: 1}, 0, g.stream, factor, int32(k), g.bufs[slotT].ptr, info.Add(4))
	}
	end()
	if err != nil {
		return false, err
	}
	var got [2]int32
	if err := g.stager.CopyFromDevice(cuda.Bytes(got[:]), info, g.stream); err != nil {
		return false, err
	}
	return got != [2]int32{}, nil
}
