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
// shares): U, the upper Cholesky factor of (H + λI)⁻¹ in the column order, and H rounded to
// float32 (for the baseline loss), both K×K on the device in the buffers of the solver that
// made it, with what the host decided from diag H. Solves only read it, so several solvers of
// its GPU may use it at once; it stays valid until its maker factors again or closes.
type Factor struct {
	maker       *GPUSolver
	generation  uint64 // the maker's factorisations when it was made
	k           int
	opt         Options // with defaults: the damping and column order it was made for
	diag        []float64
	u, h32      cuda.DevicePtr
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
	diags := make([][]float64, len(solvers))
	err := eachSolver(solvers, func(i int, g *GPUSolver) (err error) {
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
// solver builds J·P·(H + λI)·Pᵀ·J, its Cholesky factor L and U = J·L⁻¹·J, the solvers sharing
// the slices of L⁻¹'s corner (factor, gatherCorner, finishFactor); the damping grows tenfold, up to MaxDamp,
// while the factorisation fails or U is not usable.
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
		err := eachSolver(solvers, func(i int, g *GPUSolver) error { return g.factor(k, f.lambda, i, len(solvers)) })
		if err == nil { // every GPU has made its slices of L⁻¹'s corner
			err = eachSolver(solvers, func(i int, g *GPUSolver) error { return g.gatherCorner(k, solvers, i) })
		}
		if err == nil { // and has copied the others' (U overwrites them)
			err = eachSolver(solvers, func(i int, g *GPUSolver) (err error) {
				failed[i], err = g.finishFactor(k)
				return err
			})
		}
		if err != nil {
			return nil, fmt.Errorf("gptq: inverse factor: %w", err)
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
		// H in float32 for the baseline loss, into slotInverse (L⁻¹ is in U now)
		err := g.fn.narrow.Launch(cuda.Dim3{X: (k*k + 255) / 256, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream,
			g.bufs[slotH].ptr, g.bufs[slotInverse].ptr, uint64(k*k))
		if err == nil {
			err = g.dev.SynchronizeStream(g.stream)
		}
		g.generation++
		c := *f
		c.maker, c.generation, c.u, c.h32 = g, g.generation, g.bufs[slotU].ptr, g.bufs[slotInverse].ptr
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
	for slot, size := range map[int]int{slotFactor: 8 * k * k, slotInverse: 8 * k * k, slotU: 4 * k * k, slotFlags: 32} {
		if _, err := g.buffer(slot, size); err != nil {
			return err
		}
	}
	if g.poison { // tests: what a share does not write must not be read
		for _, slot := range []int{slotFactor, slotInverse, slotU} {
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

// factor builds the damped matrix and its Cholesky factor L, and inverts L (invertLower) up to
// the slices of its corner that solver me of a team of that many makes (all of them alone).
func (g *GPUSolver) factor(k int, lambda float64, me, team int) error {
	tiles := cuda.Dim3{X: (k + 31) / 32, Y: (k + 7) / 8, Z: 1}
	block := cuda.Dim3{X: 32, Y: 8, Z: 1}
	factor, info := g.bufs[slotFactor].ptr, g.bufs[slotFlags].ptr.Add(8) // potrf's info, trtri's, then U's flag
	end := g.span(phaseCholesky)
	err := g.dev.Fill32Async(info, 0, 3, g.stream)
	if err == nil {
		err = g.fn.buildFactor.Launch(tiles, block, 0, g.stream, g.bufs[slotH].ptr, g.bufs[slotRev].ptr, g.bufs[slotDead].ptr, int32(k), lambda, factor)
	}
	if err == nil {
		err = g.solver.Potrf(cuda.Lower, k, cuda.Float64, factor, k, info)
	}
	end()
	if err != nil {
		return err
	}
	end = g.span(phaseInverse)
	defer end()
	if g.inverseByTRTRI {
		return g.solver.Trtri(cuda.Lower, cuda.NonUnit, k, cuda.Float64, factor, k, info.Add(4))
	}
	return g.invertLower(k, me, team)
}

// finishFactor writes U = J·L⁻¹·J (float32, row-major, zero below the diagonal) and reports
// whether the factorisation failed: H + λI not positive definite, or U with an entry not finite
// or a diagonal entry not positive.
func (g *GPUSolver) finishFactor(k int) (failed bool, err error) {
	end := g.span(phaseInverse)
	linv, info := g.bufs[slotInverse].ptr, g.bufs[slotFlags].ptr.Add(8)
	if g.inverseByTRTRI {
		linv = g.bufs[slotFactor].ptr
	}
	square := cuda.Dim3{X: (k + 31) / 32, Y: (k + 31) / 32, Z: 1} // 32×32 tiles
	err = g.fn.unreverse.Launch(square, cuda.Dim3{X: 32, Y: 8, Z: 1}, 0, g.stream, linv, int32(k), g.bufs[slotU].ptr, info.Add(8))
	end()
	if err != nil {
		return false, err
	}
	var got [3]int32
	if err := g.stager.CopyFromDevice(cuda.Bytes(got[:]), info, g.stream); err != nil {
		return false, err
	}
	return got != [3]int32{}, nil
}

// inverseLeaf is the widest diagonal block that invertLower solves against the identity.
const inverseLeaf = 512

// invertLower writes L⁻¹ into slotInverse's lower triangle (column-major k×k, L the lower
// triangle of slotFactor; the upper triangles are not read), but for a top corner made in
// slices (topCorner): of those it makes the ones that solver me of a team of that many owns,
// into slotU's packed corner, and waits for them (finishFactor gathers the rest).
func (g *GPUSolver) invertLower(k, me, team int) error {
	linv := g.bufs[slotInverse].ptr
	if err := g.dev.Fill32Async(linv, 0, 2*k*k, g.stream); err != nil {
		return err
	}
	if err := g.fn.setDiagonal.Launch(cuda.Dim3{X: (k + 255) / 256, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream, linv, int32(k), 1.0); err != nil {
		return err
	}
	c, ok := topCorner(k)
	if !ok {
		return g.invertBlock(k, 0, k)
	}
	if err := g.invertBlock(k, 0, c.n1); err != nil {
		return err
	}
	if err := g.invertBlock(k, c.n1, c.n2); err != nil {
		return err
	}
	for i, s := range c.slices {
		if !c.shared(team) || c.owner(i, team) == me {
			if err := g.cornerSlice(k, 0, c.n1, c.n2, s, g.packedCorner(c, s), c.n2); err != nil {
				return err
			}
		}
	}
	return g.dev.SynchronizeStream(g.stream)
}

// invertBlock inverts the n×n diagonal block of L at (o, o) into the same block of slotInverse
// (the identity there on entry). With L = [A 0; B C], L⁻¹ = [A⁻¹ 0; −C⁻¹·B·A⁻¹ C⁻¹]: the halves
// are inverted first, then the corner is two triangular products — k³/3 flops in all, nearly
// all in large GEMM-like calls. (Solving L·X = I in bands of columns, each from its trailing
// triangle, took 0.4·k³ flops in narrow triangular solves: 30 ms at k = 11008 on an H100,
// cuSOLVER's trtri 82 ms.) Blocks of at most inverseLeaf columns are solved against the identity.
func (g *GPUSolver) invertBlock(k, o, n int) error {
	l, x := g.bufs[slotFactor].ptr, g.bufs[slotInverse].ptr
	at := func(p cuda.DevicePtr, row, col int) cuda.DevicePtr { return p.Add(8 * (row + col*k)) }
	if n <= inverseLeaf {
		return g.blas.Dtrsm(cuda.Left, cuda.Lower, cuda.NoTrans, cuda.NonUnit, n, n, 1, at(l, o, o), k, at(x, o, o), k)
	}
	n1, n2 := halves(n)
	if err := g.invertBlock(k, o, n1); err != nil {
		return err
	}
	if err := g.invertBlock(k, o+n1, n2); err != nil {
		return err
	}
	corner := at(x, o+n1, o)
	if n1 >= slicedFrom {
		for _, s := range columnSlices(n1) {
			if err := g.cornerSlice(k, o, n1, n2, s, corner.Add(8*s.first*k), k); err != nil {
				return err
			}
		}
		return nil
	}
	// corner = B·A⁻¹, then −C⁻¹·corner in place
	if err := g.blas.Dtrmm(cuda.Right, cuda.Lower, cuda.NoTrans, cuda.NonUnit, n2, n1, 1, at(x, o, o), k, at(l, o+n1, o), k, corner, k); err != nil {
		return err
	}
	return g.blas.Dtrmm(cuda.Left, cuda.Lower, cuda.NoTrans, cuda.NonUnit, n2, n1, -1, at(x, o+n1, o+n1), k, corner, k, corner, k)
}

// halves splits n columns for invertBlock: n1 a multiple of 64 (GEMM-friendly), n2 the rest.
func halves(n int) (n1, n2 int) {
	n1 = (n/2 + 63) &^ 63
	return n1, n - n1
}

// A corner B·A⁻¹ whose first half is at least slicedFrom wide is made in column slices of at
// most cornerSlice columns, each one GEMM (B's columns from the slice's first on, times A⁻¹'s
// rows from there: the rest of its column is zero) and one triangular product with C⁻¹ (the
// two triangular products of a whole corner ran at about 25 TFLOP/s of the H100's 67 at
// k = 28672). L⁻¹'s top corner, three quarters of the inverse's flops, is then shared by the
// GPUs factoring the same H (factorAll), when it is wide (shared): each makes the slices it owns into the packed corner
// in slotU (n2×n1, column-major, after one slice's GEMM result) and copies the others' from
// their GPUs. Every slice is made by the same calls whichever GPU makes it, so U is the same
// bit for bit on one GPU and on several. Variables, so that tests slice small matrices.
var (
	slicedFrom  = 2048
	cornerSlice = 1024
	sharedFrom  = 8192
)

// columnSlice is the columns [first, first+width) of a corner.
type columnSlice struct{ first, width int }

// columnSlices cuts n1 columns into slices of cornerSlice.
func columnSlices(n1 int) []columnSlice {
	var out []columnSlice
	for c := 0; c < n1; c += cornerSlice {
		out = append(out, columnSlice{c, min(cornerSlice, n1-c)})
	}
	return out
}

// corner is L⁻¹'s top corner made in slices: n2×n1 at (n1, 0).
type corner struct {
	n1, n2 int
	slices []columnSlice
}

// topCorner says whether the k×k inverse's top corner is made in slices, and how.
func topCorner(k int) (corner, bool) {
	n1, n2 := halves(k)
	if k <= inverseLeaf || n1 < slicedFrom || 8*n2*(cornerSlice+n1) > 4*k*k { // the packed corner lives in slotU
		return corner{}, false
	}
	return corner{n1, n2, columnSlices(n1)}, true
}

// shared says whether a team shares the corner's slices: from a first half of sharedFrom
// columns on, where the work saved outweighs the copies and the waits for the other GPUs (a
// 70B's down_proj, k = 28672: 400 → 318 ms on four H100s; at k = 8192 sharing took longer).
// Otherwise every solver makes every slice, the same way.
func (c corner) shared(team int) bool { return team > 1 && c.n1 >= sharedFrom }

// owner is the solver of a team that makes slice i: the slices, most flops first (the GEMM's
// n2·(n1 − first) and the triangular product's n2²/2 multiply-adds a column), each go to the
// solver with the fewest so far, the lowest-numbered on ties.
func (c corner) owner(i, team int) int {
	cost := func(s columnSlice) int { return s.width * (c.n2*(c.n1-s.first) + c.n2*c.n2/2) }
	order := make([]int, len(c.slices))
	for j := range order {
		order[j] = j
	}
	slices.SortStableFunc(order, func(a, b int) int { return cost(c.slices[b]) - cost(c.slices[a]) })
	load := make([]int, team)
	for _, j := range order {
		least := 0
		for p := range load {
			if load[p] < load[least] {
				least = p
			}
		}
		if j == i {
			return least
		}
		load[least] += cost(c.slices[j])
	}
	return 0
}

// packedCorner is where slice s of the top corner goes in slotU: after the first slice's GEMM
// result (n2×cornerSlice), the corner column-major with leading dimension n2.
func (g *GPUSolver) packedCorner(c corner, s columnSlice) cuda.DevicePtr {
	return g.bufs[slotU].ptr.Add(8 * c.n2 * (cornerSlice + s.first))
}

// cornerSlice writes columns s of the corner of the n×n diagonal block at (o, o), −C⁻¹·B·A⁻¹
// with A⁻¹ and C⁻¹ made (n = n1 + n2), to dst (leading dimension ld), through slotU's start.
func (g *GPUSolver) cornerSlice(k, o, n1, n2 int, s columnSlice, dst cuda.DevicePtr, ld int) error {
	l, x, tmp := g.bufs[slotFactor].ptr, g.bufs[slotInverse].ptr, g.bufs[slotU].ptr
	at := func(p cuda.DevicePtr, row, col int) cuda.DevicePtr { return p.Add(8 * (row + col*k)) }
	// tmp = B[:, first:] · A⁻¹[first:, slice] (A⁻¹'s rows above first are zero in the slice)
	err := g.blas.Dgemm(cuda.NoTrans, cuda.NoTrans, n2, s.width, n1-s.first, 1, at(l, o+n1, o+s.first), k,
		at(x, o+s.first, o+s.first), k, 0, tmp, n2)
	if err != nil {
		return err
	}
	return g.blas.Dtrmm(cuda.Left, cuda.Lower, cuda.NoTrans, cuda.NonUnit, n2, s.width, -1, at(x, o+n1, o+n1), k, tmp, n2, dst, ld)
}

// gatherCorner copies the top corner's slices that the other solvers of the team made from
// their GPUs into this one's packed corner, then the whole packed corner into L⁻¹, and waits
// for the copies (when the top corner is made in slices).
func (g *GPUSolver) gatherCorner(k int, team []*GPUSolver, me int) error {
	c, ok := topCorner(k)
	if !ok || g.inverseByTRTRI {
		return nil
	}
	end := g.span(phaseInverse)
	defer end()
	for i, s := range c.slices {
		if p := c.owner(i, len(team)); c.shared(len(team)) && p != me {
			from := team[p]
			if err := g.dev.CopyFromPeerAsync(g.packedCorner(c, s), from.dev, from.packedCorner(c, s), 8*c.n2*s.width, g.stream); err != nil {
				return err
			}
		}
	}
	dst := g.bufs[slotInverse].ptr.Add(8 * c.n1) // (n1, 0)
	grid := cuda.Dim3{X: (c.n2 + 255) / 256, Y: min(c.n1, 65535), Z: 1}
	err := g.fn.copyColumns.Launch(grid, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream,
		g.packedCorner(c, c.slices[0]), int32(c.n2), int32(c.n2), int32(c.n1), dst, int32(k))
	if err != nil {
		return err
	}
	return g.dev.SynchronizeStream(g.stream)
}
