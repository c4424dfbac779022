package convert

import (
	"fmt"
	"strings"
	"sync"

	"github.com/qpack-dev/qpack/model"
)

// ExpertOptions say how the experts of a mixture-of-experts model are calibrated (GPTQ's
// Hessians, AWQ's statistics, --imatrix and a plan's activation statistics).
type ExpertOptions struct {
	// AllTokens calibrates every expert on every calibration token instead of the tokens the
	// router sends it (the router still decides each block's output, so later blocks see the
	// model's own activations).
	AllTokens bool
	// MinTokens: an expert that fewer calibration tokens were routed to in its block is
	// calibrated on every token instead (logged); 0 means DefaultMinExpertTokens.
	MinTokens int
	// RoutingWeighted weighs each routed token's contribution to an expert's statistics by the
	// square of its routing weight: the expert's output reaches the block scaled by that
	// weight, so its output error's square by the weight's square (docs/moe.md measures it).
	RoutingWeighted bool
}

// ParseExpertCalibration reads --moe-calib (routed, weighted or all) and --moe-min-tokens.
func ParseExpertCalibration(mode string, minTokens int) (ExpertOptions, error) {
	o := ExpertOptions{MinTokens: minTokens}
	switch mode {
	case "", "routed":
	case "weighted":
		o.RoutingWeighted = true
	case "all":
		o.AllTokens = true
	default:
		return o, fmt.Errorf("--moe-calib %q: want routed, weighted or all", mode)
	}
	if minTokens < 0 {
		return o, fmt.Errorf("--moe-min-tokens %d is negative", minTokens)
	}
	return o, nil
}

// DefaultMinExpertTokens is the fewest routed calibration tokens an expert is calibrated on:
// below it an expert's Hessian is a few tokens' outer products, which GPTQ would fit closely
// and generalize from badly, so it is calibrated on every token instead (docs/moe.md).
const DefaultMinExpertTokens = 128

// expertRouting follows, per block, how many calibration tokens reached each expert and
// decides which experts are calibrated on every token: all of them under AllTokens, otherwise
// those with fewer than MinTokens. The calibrators count the rows of each accumulation of an
// expert's gate/up input (start, add); the model asks allTokens before observing a down input
// (model.ExpertObservation), after every gate/up input of the step.
type expertRouting struct {
	opt  ExpertOptions
	logf func(string, ...any)

	mu     sync.Mutex
	counts map[[2]int]int // (block, expert) → routed tokens of its latest accumulation
	logged map[int]bool
}

func newExpertRouting(opt ExpertOptions, logf func(string, ...any)) *expertRouting {
	if opt.MinTokens <= 0 {
		opt.MinTokens = DefaultMinExpertTokens
	}
	return &expertRouting{opt: opt, logf: logf, counts: map[[2]int]int{}, logged: map[int]bool{}}
}

// observation is what the model needs to observe the experts as decided here.
func (x *expertRouting) observation() model.ExpertObservation {
	o := model.ExpertObservation{AllTokens: x.allTokens}
	if x.opt.RoutingWeighted {
		o.WeightPower = 2
	}
	return o
}

// start begins a new accumulation of group g's inputs in block: an expert's count restarts.
func (x *expertRouting) start(block int, g model.Group) {
	if e, ok := g.Expert(); ok && g.Stage() == model.GroupGateUp.Stage() {
		x.mu.Lock()
		x.counts[[2]int{block, e}] = 0
		x.mu.Unlock()
	}
}

// add counts rows observed of group g in block.
func (x *expertRouting) add(block int, g model.Group, rows int) {
	if e, ok := g.Expert(); ok && g.Stage() == model.GroupGateUp.Stage() {
		x.mu.Lock()
		x.counts[[2]int{block, e}] += rows
		x.mu.Unlock()
	}
}

// allTokens says whether expert e of block is calibrated on every token.
func (x *expertRouting) allTokens(block, e int) bool {
	if x.opt.AllTokens {
		return true
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.counts[[2]int{block, e}] < x.opt.MinTokens
}

// source is the group whose inputs calibrate g: g itself, or for the gate/up of an expert
// calibrated on every token GroupGateUp, which observes exactly that (every token's normed
// hidden state).
func (x *expertRouting) source(block int, g model.Group) model.Group {
	if e, ok := g.Expert(); ok && g.Stage() == model.GroupGateUp.Stage() && x.allTokens(block, e) {
		return model.GroupGateUp
	}
	return g
}

// report logs, once per block of experts, the tokens routed to each expert and which experts
// are calibrated on every token (total: the calibration tokens).
func (x *expertRouting) report(what string, b *model.Block, total int) {
	if b.MoE == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.logged[b.Index] {
		return
	}
	x.logged[b.Index] = true
	var counts, fallback []string
	for e := range b.MoE.Experts {
		n := x.counts[[2]int{b.Index, e}]
		counts = append(counts, fmt.Sprint(n))
		if !x.opt.AllTokens && n < x.opt.MinTokens {
			fallback = append(fallback, fmt.Sprintf("expert %d (%d tokens)", e, n))
		}
	}
	x.logf("%s block %d: calibration tokens routed to experts 0-%d: %s (%d tokens, %d experts each)\n", what, b.Index, len(b.MoE.Experts)-1,
		strings.Join(counts, " "), total, b.MoE.TopK)
	switch {
	case x.opt.AllTokens:
		x.logf("%s block %d: every expert calibrated on all %d tokens (--moe-calib all)\n", what, b.Index, total)
	case len(fallback) > 0 && x.opt.RoutingWeighted:
		x.logf("%s block %d: %s below the minimum of %d: calibrated on all %d tokens instead, unweighted (--moe-min-tokens)\n",
			what, b.Index, strings.Join(fallback, ", "), x.opt.MinTokens, total)
	case len(fallback) > 0:
		x.logf("%s block %d: %s below the minimum of %d: calibrated on all %d tokens instead (--moe-min-tokens)\n",
			what, b.Index, strings.Join(fallback, ", "), x.opt.MinTokens, total)
	}
}
