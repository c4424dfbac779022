package gptq

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/shares"
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
		// A solve's results may still be coming down through its stream and pinned buffer; the
		// Gram matrix is the caller's again once the factors are made.
		g.settle()
		defer func() { g.h = hSource{} }()
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

// factorAll makes the factors of the H each solver reads (hSource), whose diagonal is diag: each
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
	if err := eachSolver(solvers, func(_ int, g *GPUSolver) error {
		defer g.mark("factor's buffers")()
		return g.prepareFactor(k, perm, dead)
	}); err != nil {
		return nil, err
	}
	f := &Factor{k: k, opt: opt, diag: diag}
	shared := sharesFactor(solvers, k)
	for f.damp = opt.Damp; ; f.damp *= 10 {
		f.lambda = f.damp * meanDiag
		var failed []bool
		var err error
		if shared {
			failed, err = factorShared(solvers, k, f.lambda)
		} else {
			failed = make([]bool, len(solvers))
			err = eachSolver(solvers, func(i int, g *GPUSolver) (err error) {
				defer g.mark("Cholesky")()
				failed[i], err = g.factor(k, f.lambda)
				return err
			})
		}
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
		h, gram, scale := g.hArgs()
		err := g.fn.narrow.Launch(cuda.Dim3{X: (k*k + 255) / 256, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream,
			h, gram, scale, g.bufs[slotH32].ptr, uint64(k*k))
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
	end := g.span(phaseCholesky)
	err = g.buildDamped(k, lambda)
	if err == nil {
		err = g.solver.Potrf(cuda.Lower, k, cuda.Float64, g.bufs[slotFactor].ptr, k, g.potrfInfo())
	}
	if err == nil {
		err = g.writeT(k)
	}
	end()
	if err != nil {
		return false, err
	}
	return g.factorFailed()
}

// potrfInfo is where a factorisation of the whole matrix writes potrf's info; T′'s flag follows
// it. (A shared factorisation's potrf calls write theirs in slotInfos.)
func (g *GPUSolver) potrfInfo() cuda.DevicePtr { return g.bufs[slotFlags].ptr.Add(8) }

// buildDamped clears the factorisation's flags and builds J·P·(H + λI)·Pᵀ·J in slotFactor's
// lower triangle.
func (g *GPUSolver) buildDamped(k int, lambda float64) error {
	if err := g.dev.Fill32Async(g.potrfInfo(), 0, 2, g.stream); err != nil {
		return err
	}
	tiles := cuda.Dim3{X: (k + 31) / 32, Y: (k + 7) / 8, Z: 1}
	h, gram, scale := g.hArgs()
	return g.fn.buildFactor.Launch(tiles, cuda.Dim3{X: 32, Y: 8, Z: 1}, 0, g.stream,
		h, gram, scale, g.bufs[slotRev].ptr, g.bufs[slotDead].ptr, int32(k), lambda, g.bufs[slotFactor].ptr)
}

// writeT writes T′ from the factor L in slotFactor into slotT, flagging bad entries.
func (g *GPUSolver) writeT(k int) error {
	square := cuda.Dim3{X: (k + 31) / 32, Y: (k + 31) / 32, Z: 1} // 32×32 tiles
	return g.fn.unreverse.Launch(square, cuda.Dim3{X: 32, Y: 8, Z: 1}, 0, g.stream, g.bufs[slotFactor].ptr, int32(k), g.bufs[slotT].ptr, g.potrfInfo().Add(4))
}

// factorFailed waits for the factorisation and says whether a potrf or T′ failed.
func (g *GPUSolver) factorFailed() (bool, error) {
	var got [2]int32 // potrf info, T′'s flag
	if err := g.stager.CopyFromDevice(cuda.Bytes(got[:]), g.potrfInfo(), g.stream); err != nil {
		return false, err
	}
	return got != [2]int32{}, nil
}

// sharedFactorFailed waits for a shared factorisation and says whether one of its leaves' potrf or
// T′ failed.
func (g *GPUSolver) sharedFactorFailed(leaves int) (bool, error) {
	if bad, err := g.factorFailed(); bad || err != nil {
		return bad, err
	}
	infos := make([]int32, leaves)
	if err := g.stager.CopyFromDevice(cuda.Bytes(infos), g.bufs[slotInfos].ptr, g.stream); err != nil {
		return false, err
	}
	return slices.ContainsFunc(infos, func(v int32) bool { return v != 0 }), nil
}

// splitFactorMin is the narrowest Hessian whose factorisation several GPUs share, and the
// narrowest half of one that they share again (factorShared). Narrower ones are latency-bound:
// on four H100s at k = 8192 sharing took 9.7 ms against 9.5 whole (BenchmarkGPUFactorShared),
// so each GPU factors its copy. On four H200s a 70B's down_proj (k = 28672) took 164 ms whole,
// 105 ms shared in halves and 97 ms with each half shared again.
var splitFactorMin = 10240

// sharesFactor says whether solvers (one per GPU, each reaching the others' memory) share the
// factorisation of a k×k Hessian.
func sharesFactor(solvers []*GPUSolver, k int) bool {
	if len(solvers) < 2 || k < splitFactorMin {
		return false
	}
	devs := make([]*cuda.Device, len(solvers))
	for i, g := range solvers {
		devs[i] = g.dev
	}
	return cuda.AllReach(devs)
}

// factorShared is factor on several GPUs at once, the work shared where it is largest
// (choleskyShared). Every GPU ends with the same bits.
func factorShared(solvers []*GPUSolver, k int, lambda float64) (failed []bool, err error) {
	leaves := sharedLeaves(k)
	err = eachSolver(solvers, func(_ int, g *GPUSolver) error { // queued: the steps after it wait
		infos, err := g.buffer(slotInfos, 4*leaves)
		if err == nil {
			err = g.dev.Fill32Async(infos, 0, leaves, g.stream)
		}
		if err == nil {
			err = g.buildDamped(k, lambda)
		}
		return err
	})
	if err == nil {
		leaf := 0
		err = choleskyShared(solvers, k, 0, k, &leaf)
	}
	if err != nil {
		return nil, err
	}
	failed = make([]bool, len(solvers))
	err = eachSolver(solvers, func(i int, g *GPUSolver) (err error) {
		defer g.mark("Cholesky, the last block and T′")()
		end := g.span(phaseCholesky)
		err = g.writeT(k)
		end()
		if err == nil {
			failed[i], err = g.sharedFactorFailed(leaves)
		}
		return err
	})
	return failed, err
}

// sharedLeaves is how many diagonal blocks choleskyShared factors whole for a k×k matrix.
func sharedLeaves(n int) int {
	if factoredWhole(n) {
		return 1
	}
	return sharedLeaves(n/2) + sharedLeaves(n-n/2)
}

// factoredWhole says whether choleskyShared has every GPU factor a diagonal block n wide whole.
func factoredWhole(n int) bool { return n < splitFactorMin || n < 2 }

// choleskyShared factors the diagonal block [off, off+n) of every solver's damped matrix, which
// the blocks before it have updated, sharing the work among the GPUs where it is largest. With the
// block A = [A11 ·; A21 A22] split in halves, its Cholesky factor is L11 = chol(A11),
// L21 = A21·L11⁻ᵀ, L22 = chol(A22 − L21·L21ᵀ). The halves are factored the same way while they
// are at least splitFactorMin wide; narrower ones every GPU factors whole (potrf is
// latency-bound there), its info at the next leaf of slotInfos. Each GPU solves its share of
// L21's rows; once all have, each copies the others' rows from their memory, updates a band of
// A22's columns (equal areas of its lower triangle) and writes it into every GPU's matrix. The
// triangular solves and the updates, most of the flops, divide by the GPUs; no GPU writes where
// another reads between two rendezvous.
func choleskyShared(solvers []*GPUSolver, k, off, n int, leaf *int) error {
	at := func(g *GPUSolver, row, col int) cuda.DevicePtr { // entry (row, col) of g's matrix
		return g.bufs[slotFactor].ptr.Add(8 * (row + col*k))
	}
	if factoredWhole(n) {
		info := *leaf
		*leaf++
		return eachSolver(solvers, func(_ int, g *GPUSolver) error { // queued: only this GPU's next steps read it
			defer g.span(phaseCholesky)()
			return g.solver.Potrf(cuda.Lower, n, cuda.Float64, at(g, off, off), k, g.bufs[slotInfos].ptr.Add(4*info))
		})
	}
	n1 := n / 2
	n2 := n - n1
	if err := choleskyShared(solvers, k, off, n1, leaf); err != nil {
		return err
	}
	top := off + n1 // A22's first row and column
	rows, cols := shares.Even(n2, len(solvers)), shares.Lower(n2, len(solvers))
	copyBlock := func(g, from, to *GPUSolver, row0, rows, col0, cols int) error { // on g's stream
		if rows == 0 || cols == 0 {
			return nil
		}
		return g.fn.copyBlock.Launch(cuda.Dim3{X: (rows + 255) / 256, Y: cols, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream,
			from.bufs[slotFactor].ptr, to.bufs[slotFactor].ptr, int32(k), int32(row0), int32(rows), int32(col0))
	}
	err := eachSolver(solvers, func(i int, g *GPUSolver) error { // a share of L21's rows each
		defer g.mark(fmt.Sprintf("Cholesky, %d columns and the rows below", n1))()
		defer g.span(phaseCholesky)()
		r0, r1 := top+rows[i], top+rows[i+1]
		var err error
		if r1 > r0 {
			err = g.blas.DtrsmRightLowerTrans(r1-r0, n1, 1, at(g, off, off), k, at(g, r0, off), k)
		}
		if err == nil {
			err = g.dev.SynchronizeStream(g.stream)
		}
		return err
	})
	if err != nil {
		return err
	}
	err = eachSolver(solvers, func(i int, g *GPUSolver) error { // A22 − L21·L21ᵀ, a band of columns each
		defer g.mark(fmt.Sprintf("Cholesky, update of %d", n2))()
		defer g.span(phaseCholesky)()
		for j, other := range solvers { // the others' rows of L21
			if j != i {
				if err := copyBlock(g, other, g, top+rows[j], rows[j+1]-rows[j], off, n1); err != nil {
					return err
				}
			}
		}
		end := off + n
		a, b := top+cols[i], top+cols[i+1]
		if b == a {
			return g.dev.SynchronizeStream(g.stream)
		}
		err := g.blas.DsyrkLower(b-a, n1, -1, at(g, a, off), k, 1, at(g, a, a), k)
		if err == nil && b < end {
			err = g.blas.Dgemm(cuda.NoTrans, cuda.Trans, end-b, b-a, n1, -1, at(g, b, off), k, at(g, a, off), k, 1, at(g, b, a), k)
		}
		for j, other := range solvers { // the band into the others' matrices (rows [a, end), the lower part used)
			if j != i && err == nil {
				err = copyBlock(g, g, other, a, end-a, a, b-a)
			}
		}
		if err == nil {
			err = g.dev.SynchronizeStream(g.stream)
		}
		return err
	})
	if err != nil {
		return err
	}
	return choleskyShared(solvers, k, top, n2, leaf)
}
