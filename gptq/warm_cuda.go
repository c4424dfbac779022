package gptq

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/quant"
)

// A solver's first factorisation and first solve pay for what the driver, cuBLAS and cuSOLVER do
// on first use (loading kernels, workspaces) and for growing its buffers: in a conversion a few
// hundred milliseconds of the first block. WarmFactor and Warm do it on a synthetic problem while
// the model is still opening.

// WarmFactor factors a synthetic k×k Hessian (H = I) in the solver's buffers, as FactorGram
// would a gathered one, and returns the factor for Warm (this solver's and those of others on
// its GPU, until it factors again).
func (g *GPUSolver) WarmFactor(k int, opt Options) (*Factor, error) {
	g.settle()
	defer g.mark("warm up the factorisation")()
	if k <= 0 {
		return nil, fmt.Errorf("gptq: warm-up width %d must be positive", k)
	}
	diag := slices.Repeat([]float64{1}, k)
	g.h = hSource{}
	h, err := g.buffer(slotH, 8*k*k)
	if err != nil {
		return nil, err
	}
	ones, err := g.buffer(slotBaseRows, 8*k)
	if err == nil {
		err = g.dev.Fill32Async(h, 0, 2*k*k, g.stream)
	}
	if err == nil {
		err = g.stager.CopyToDevice(ones, cuda.Bytes(diag), g.stream)
	}
	if err == nil {
		err = g.blas.Dcopy(k, ones, 1, h, k+1) // H's diagonal
	}
	if err != nil {
		return nil, err
	}
	f, err := factorAll([]*GPUSolver{g}, diag, k, opt, time.Now())
	if err != nil {
		return nil, err
	}
	return f[0], nil
}

// Warm runs one solve of n rows of scheme s with the synthetic factor f (every weight ½; the
// baseline loss when opt asks for it, and the dequantized weights) and throws the result away.
// The solver's buffers keep the size of that problem: give the shape it will solve most.
func (g *GPUSolver) Warm(n int, f *Factor, s quant.Scheme, opt Options) error {
	g.settle()
	defer g.mark("warm up")()
	k := f.k
	if n <= 0 {
		return fmt.Errorf("gptq: warm-up rows %d must be positive", n)
	}
	if err := CheckScheme(s, k, opt); err != nil {
		return err
	}
	if err := g.supports(s, opt); err != nil {
		return err
	}
	if err := f.usableBy(g, opt); err != nil {
		return err
	}
	p, err := g.plan(n, k, f.diag, s, opt)
	if err != nil {
		return err
	}
	orig, err := g.buffer(slotOrig, 4*n*k)
	if err == nil {
		err = g.dev.Fill32Async(orig, math.Float32bits(0.5), n*k, g.stream)
	}
	if err != nil {
		return err
	}
	results, err := g.solvePlaced(p, f, &Stats{}, true) // resident, as an engine's weights are
	if err == nil {
		_, err = results()
	}
	if err != nil {
		return err
	}
	return g.DequantizeTo(orig)
}
