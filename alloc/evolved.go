package alloc

import (
	"fmt"

	"github.com/qpack-dev/qpack/model"
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

// evolved applies the rule to the free candidates: the classifier (when opted in) and the
// embedding (the model's input edge) take the high rung, the edge blocks take the high rung,
// the middle takes the low rung unless its measured sensitivity there exceeds the threshold.
// Only the low rung's sensitivity of middle tensors is measured.
func (p *Planner) evolved(ladder []Choice, opts Options, free []int, verdicts []verdict) error {
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
	for _, i := range free {
		t := p.tensors[i]
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
			s, err := p.sensitivity(t, low.Scheme)
			if err != nil {
				return err
			}
			if s > rule.Threshold {
				reason = fmt.Sprintf("measured sensitivity %.4g > %g at %s", s, rule.Threshold, low)
			} else {
				choice = low
				reason = fmt.Sprintf("measured sensitivity %.4g ≤ %g", s, rule.Threshold)
			}
		}
		verdicts[i].choice, verdicts[i].reason = choice, reason
	}
	return nil
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
