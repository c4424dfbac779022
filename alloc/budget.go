package alloc

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
)

// budget picks, for every free candidate, the rung that minimises Σ_t e_t(rung) subject to the
// byte budget, where e_t is the measured relative error of tensor t.
//
// Why the plain sum of relative errors, not a params-weighted one: a linear's relative error is
// the relative perturbation it adds to the residual stream, whatever its parameter count, and
// the HIGGS linearity result (perplexity rise ≈ Σ_l α_l · relative ℓ2 error_l) weighs layers by
// a per-layer coefficient, not by size. Weighting by params would make a small tensor's error
// count for little, so the solver would never see that upgrading it (attn_v under GQA, say) is
// cheap; unweighted, the knapsack finds exactly the cheap upgrades llama.cpp hand-codes. The
// importance weighting HAWQ and EXL2 apply lives in the measurement: with calibration the
// caller's Measure is activation-weighted (tr(ΔW H ΔWᵀ)/tr(W H Wᵀ)), and a caller with
// per-tensor coefficients can fold them into Measure.
//
// A group of tied tensors is one item: each rung costs the members' bytes and errs their sum.
func (p *Planner) budget(ladder []Choice, opts Options, groups [][]int, verdicts []verdict, plan *Plan) (*Budget, error) {
	bpw := opts.TargetBPW
	if math.IsNaN(bpw) || math.IsInf(bpw, 0) || bpw < 0 || opts.TargetBytes < 0 {
		return nil, fmt.Errorf("budget: bad target (bpw %v, size %d bytes)", opts.TargetBPW, opts.TargetBytes)
	}
	if bpw == 0 && opts.TargetBytes == 0 {
		return nil, fmt.Errorf("budget strategy needs a target bpw or a target size")
	}
	var rungs []Choice
	for _, c := range ladder {
		if err := p.checkSupported(c); err != nil {
			plan.Warnings = append(plan.Warnings, fmt.Sprintf("ladder rung %s left out: %v", c, err))
			continue
		}
		rungs = append(rungs, c)
	}
	if len(rungs) == 0 {
		return nil, fmt.Errorf("budget: the output format holds none of the ladder's rungs")
	}

	// Costs first, so that an infeasible budget is refused before anything is measured.
	isFree := make([]bool, len(p.tensors))
	for _, g := range groups {
		for _, i := range g {
			isFree[i] = true
		}
	}
	var candParams, fixedCand, fixedAll int64
	for i, t := range p.tensors {
		v := verdicts[i]
		if v.candidate {
			candParams += t.Params
		}
		if isFree[i] {
			continue
		}
		b, err := p.bytes(t, v.choice)
		if err != nil {
			return nil, err
		}
		fixedAll += b
		if v.candidate {
			fixedCand += b
		}
	}
	items := make([]item, len(groups))
	var minFree, maxFree int64
	for f, g := range groups {
		t := p.tensors[g[0]] // tied tensors have one shape
		items[f] = item{name: t.Name}
		var unfit []error
		for r, c := range rungs {
			if err := fits(t, c, opts.Fallback); err != nil {
				unfit = append(unfit, err)
				continue
			}
			var cost int64
			for _, i := range g {
				b, err := p.bytes(p.tensors[i], c)
				if err != nil {
					return nil, err
				}
				cost += b
			}
			items[f].options = append(items[f].options, option{cost: cost, rung: r})
		}
		if len(items[f].options) == 0 {
			return nil, fmt.Errorf("budget: tensor %s fits none of the ladder's rungs: %w", t.Name, errors.Join(unfit...))
		}
		minFree += minCost(items[f])
		maxFree += maxCost(items[f])
	}
	info := &Budget{TargetBPW: opts.TargetBPW, TargetBytes: opts.TargetBytes}
	info.FreeBytes = math.MaxInt64
	if opts.TargetBPW > 0 {
		if candParams == 0 {
			return nil, fmt.Errorf("budget: a target bpw needs candidate tensors, there are none")
		}
		// The small slack absorbs float rounding when target·params/8 is an exact integer.
		limit := int64(math.Floor(opts.TargetBPW*float64(candParams)/8 + 1e-6))
		if minFree > limit-fixedCand {
			least := ceilTo(bitsPerWeight(minFree+fixedCand, candParams), 1e4)
			return nil, fmt.Errorf("budget infeasible: target %g bpw is below the minimum achievable %.4f bpw "+
				"over the candidate tensors (every unpinned candidate at its cheapest rung, pins as given)",
				opts.TargetBPW, least)
		}
		info.FreeBytes = limit - fixedCand
	}
	if opts.TargetBytes > 0 {
		if minFree > opts.TargetBytes-fixedAll {
			return nil, fmt.Errorf("budget infeasible: target size %d bytes is below the minimum achievable %d bytes "+
				"for the whole checkpoint (every unpinned candidate at its cheapest rung, pins and kept tensors as given)",
				opts.TargetBytes, minFree+fixedAll)
		}
		info.FreeBytes = min(info.FreeBytes, opts.TargetBytes-fixedAll)
	}
	if maxFree <= info.FreeBytes {
		plan.Warnings = append(plan.Warnings, fmt.Sprintf("the target is at or above the ladder's top: every candidate fits its most "+
			"expensive rung (%s), so the budget does not limit the plan", topOf(rungs)))
	}

	if err := p.measureItems(items, rungs, groups); err != nil {
		return nil, err
	}
	sol, err := solveKnapsack(items, info.FreeBytes)
	if err != nil {
		return nil, err
	}
	reason := "budget: exact optimum (DP)"
	info.Solver = "dp"
	if !sol.exact {
		info.Solver, info.Lambda = "lagrangian", sol.lambda
		reason = fmt.Sprintf("budget: λ=%.4g error per MiB", sol.lambda*(1<<20))
	}
	for f, g := range groups {
		for _, i := range g {
			verdicts[i].choice, verdicts[i].reason = rungs[items[f].options[sol.picks[f]].rung], reason
		}
	}
	return info, nil
}

// measureItems fills in every option's sensitivity (a group's: the sum of its members'), groups
// in parallel on GOMAXPROCS goroutines (each tensor's rungs one after another on one of them,
// as MeasureFunc promises).
func (p *Planner) measureItems(items []item, rungs []Choice, groups [][]int) error {
	work := make(chan int)
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(groups)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				for o := range items[f].options {
					c := rungs[items[f].options[o].rung]
					if c.Keep {
						continue // no quantization error
					}
					s, err := p.groupSensitivity(groups[f], c.Scheme)
					if err != nil {
						errs[f] = err
						break
					}
					items[f].options[o].err = s
				}
			}
		}()
	}
	for f := range groups {
		work <- f
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

// fits says whether tensor t can take choice c: k-quant rungs need rows of whole sub-blocks, so
// a ladder can hold them even when some tensors' rows are too short or odd, and the output
// format must store c as it is (fb).
func fits(t TensorDesc, c Choice, fb FallbackFunc) error {
	if c.Keep {
		return nil
	}
	if err := c.Scheme.CheckRowLength(t.Shape[1]); err != nil || fb == nil {
		return err
	}
	stored, why, err := fb(c.Scheme, t.Shape[0], t.Shape[1])
	if err == nil && stored != c {
		err = fmt.Errorf("%s: %s", c, why)
	}
	return err
}

// topOf names the ladder's most precise rung, for messages.
func topOf(rungs []Choice) string { return rungs[len(rungs)-1].String() }

// ceilTo rounds x up to a multiple of 1/scale, so a printed minimum is itself achievable.
func ceilTo(x, scale float64) float64 { return math.Ceil(x*scale) / scale }
