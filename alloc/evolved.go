package alloc

import (
	"fmt"

	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

// EvolvedRule holds the constants of the allocator evolved on synthetic layer data (DESIGN.md,
// "The allocator"). Norms and the classifier are protected by Planner.Plan's candidate rules.
type EvolvedRule struct {
	// EdgeFraction: blocks whose relative position is within this fraction of either end
	// (position ≤ f from the first, or ≤ f from the last) take the high rung. Inclusive, so a
	// block exactly at 7.5% is protected; 0 protects no block.
	EdgeFraction float64
	// Threshold: a middle tensor whose measured sensitivity at the low rung is strictly greater
	// takes the high rung; otherwise the low one.
	Threshold float64
}

// DefaultEvolvedRule is the rule as evolved: 7.5% edges, threshold 0.001.
var DefaultEvolvedRule = EvolvedRule{EdgeFraction: 0.075, Threshold: 0.001}

// evolved applies the rule to the free candidates, each group of tied tensors as one: the
// classifier (when opted in) and the embedding (the model's input edge) take the high rung, the
// edge blocks take the high rung, the middle takes the low rung unless its measured sensitivity
// there (a group's: its members' mean) exceeds the threshold. Only the low rung's sensitivity
// of middle tensors is measured.
func (p *Planner) evolved(ladder []Choice, opts Options, groups [][]int, verdicts []verdict) error {
	rule := DefaultEvolvedRule
	if opts.Evolved != nil {
		rule = *opts.Evolved
	}
	if len(ladder) < 2 {
		return fmt.Errorf("evolved strategy needs a low and a high rung, the ladder has %d", len(ladder))
	}
	low, high := ladder[0], ladder[len(ladder)-1]
	for _, c := range []Choice{low, high} {
		if err := p.checkSupported(c); err != nil {
			return fmt.Errorf("evolved strategy, rung %s: %w", c, err)
		}
	}
	isEdge := func(t TensorDesc, fromLast bool) bool {
		return t.Block >= 0 && rule.EdgeFraction > 0 && t.edgeDistance(fromLast) <= rule.EdgeFraction
	}
	for _, g := range groups {
		t := p.tensors[g[0]] // tied tensors share a block and a role
		choice, reason := high, ""
		switch {
		case t.Role == model.RoleClassifier:
			reason = "rule: classifier protected"
		case t.Role == model.RoleEmbedding:
			reason = "rule: embedding protected (input edge)"
		case isEdge(t, false):
			reason = fmt.Sprintf("rule: first %g%% of blocks (block %d of %d)", 100*rule.EdgeFraction, t.Block, t.NumBlocks)
		case isEdge(t, true):
			reason = fmt.Sprintf("rule: last %g%% of blocks (block %d of %d)", 100*rule.EdgeFraction, t.Block, t.NumBlocks)
		default:
			s, err := p.groupSensitivity(g, low.Scheme)
			if err != nil {
				return err
			}
			s /= float64(len(g))
			of := ""
			if len(g) > 1 {
				of = fmt.Sprintf(" (mean of %d tied tensors)", len(g))
			}
			if s > rule.Threshold {
				reason = fmt.Sprintf("measured sensitivity%s %.4g > %g at %s", of, s, rule.Threshold, low)
			} else {
				choice = low
				reason = fmt.Sprintf("measured sensitivity%s %.4g ≤ %g", of, s, rule.Threshold)
			}
		}
		for _, i := range g {
			verdicts[i].choice, verdicts[i].reason = choice, reason
		}
	}
	return nil
}

// groupSensitivity is the sum of a group's sensitivities under s.
func (p *Planner) groupSensitivity(g []int, s quant.Scheme) (float64, error) {
	var sum float64
	for _, i := range g {
		v, err := p.sensitivity(p.tensors[i], s)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// edgeDistance is the relative distance of t's block from the first block (0…1), or from the
// last when fromLast. Both ends are computed the same way, (distance in blocks)/(NumBlocks−1), so
// the boundary rounds identically at either end (1 − 0.075 is not exactly 37/40 in float64).
func (t TensorDesc) edgeDistance(fromLast bool) float64 {
	if t.NumBlocks <= 1 {
		return 0
	}
	d := t.Block
	if fromLast {
		d = t.NumBlocks - 1 - t.Block
	}
	return float64(d) / float64(t.NumBlocks-1)
}
