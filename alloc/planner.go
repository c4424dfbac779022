package alloc

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

// Strategies.
const (
	StrategyUniform = "uniform" // one scheme for every candidate
	StrategyEvolved = "evolved" // the evolved rule: protect edges, measure the middle
	StrategyBudget  = "budget"  // least total sensitivity under a bpw or size budget
)

// CostFunc gives the exact stored bytes of an N×K weight quantized with s in the output
// format, scales, zero points and g_idx included.
type CostFunc func(s quant.Scheme, n, k int) int64

// MeasureFunc gives the relative error of t quantized with s: weight-space without
// calibration, activation-weighted tr(ΔW H ΔWᵀ)/tr(W H Wᵀ) with it; the caller decides. The
// budget strategy calls it concurrently for different tensors; the calls for one tensor come
// one after another from one goroutine.
type MeasureFunc func(t TensorDesc, s quant.Scheme) (float64, error)

// Options say how to plan.
type Options struct {
	Strategy string
	// Ladder lists the candidate rungs, lowest precision first; nil takes DefaultLadder(Strategy).
	// uniform uses its single rung, evolved its lowest and highest, budget all of them.
	Ladder    []Choice
	Overrides []Override // first match wins; pins hold in every strategy
	// Embeddings and the classifier stay in their input dtype unless opted in.
	QuantizeEmbeddings, QuantizeHead bool
	// Budget strategy: at most TargetBPW bits per weight over the candidate tensors and/or at
	// most TargetBytes over the whole output checkpoint; zero means unset.
	TargetBPW   float64
	TargetBytes int64
	Evolved     *EvolvedRule // nil: DefaultEvolvedRule
	// Fallback, when set, is the output format's word on a scheme for a tensor's shape: what it
	// stores instead when it cannot store s for rows of k weights (GGUF, as llama.cpp: Q5_0 for
	// a Q4_K tensor whose rows are not whole super-blocks; keep when nothing fits) and why, s
	// itself when it can, or an error when it has no substitute. Uniform, evolved and pinned choices are
	// replaced; the budget strategy offers a tensor only the rungs the format stores as they are.
	Fallback FallbackFunc `json:"-"`
	// Tie, when set, names the group a tensor belongs to ("" for none): the tensors of a group
	// take one choice (see tie.go).
	Tie func(name string) string `json:"-"`
}

// FallbackFunc gives the scheme an output format stores for an n×k weight planned as s, and
// why it differs from s.
type FallbackFunc func(s quant.Scheme, n, k int) (Choice, string, error)

// Planner plans one checkpoint. It caches sensitivities per (tensor, scheme), so plans for
// several budgets or strategies measure each pair once. It is not safe for concurrent use.
type Planner struct {
	mu       sync.Mutex   // guards sens, used and calls while the budget strategy measures in parallel
	tensors  []TensorDesc // sorted by name
	cost     CostFunc
	supports SupportsFunc
	measure  MeasureFunc
	sens     map[string]map[string]float64 // tensor → scheme → sensitivity, across plans
	used     map[string]map[string]float64 // what the plan being made looked at
	calls    int
}

// NewPlanner checks the tensor list. cost is required; supports may be nil (every valid scheme
// allowed); measure may be nil when only uniform plans are made.
func NewPlanner(tensors []TensorDesc, cost CostFunc, supports SupportsFunc, measure MeasureFunc) (*Planner, error) {
	if cost == nil {
		return nil, fmt.Errorf("alloc: a cost function is required")
	}
	sorted := slices.Clone(tensors)
	slices.SortFunc(sorted, func(a, b TensorDesc) int { return strings.Compare(a.Name, b.Name) })
	for i, t := range sorted {
		if i > 0 && sorted[i-1].Name == t.Name {
			return nil, fmt.Errorf("tensor %s: listed twice", t.Name)
		}
		if _, err := dtypeBytes(t.DType); err != nil {
			return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
		}
	}
	return &Planner{tensors: sorted, cost: cost, supports: supports, measure: measure,
		sens: map[string]map[string]float64{}}, nil
}

// Measurements is how many times Measure has been called.
func (p *Planner) Measurements() int { return p.calls }

// sensitivity returns the cached or newly measured sensitivity of t under s.
func (p *Planner) sensitivity(t TensorDesc, s quant.Scheme) (float64, error) {
	key := s.String()
	p.mu.Lock()
	v, ok := p.sens[t.Name][key]
	p.mu.Unlock()
	if !ok {
		var err error
		if v, err = p.measureOnce(t, s); err != nil {
			return 0, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used[t.Name] == nil {
		p.used[t.Name] = map[string]float64{}
	}
	p.used[t.Name][key] = v
	return v, nil
}

func (p *Planner) measureOnce(t TensorDesc, s quant.Scheme) (float64, error) {
	key := s.String()
	if p.measure == nil {
		return 0, fmt.Errorf("alloc: strategy needs sensitivities but no measure function was given")
	}
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
	v, err := p.measure(t, s)
	if err != nil {
		return 0, fmt.Errorf("measuring %s at %s: %w", t.Name, key, err)
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("measuring %s at %s: sensitivity %v is not a finite non-negative number", t.Name, key, v)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sens[t.Name] == nil {
		p.sens[t.Name] = map[string]float64{}
	}
	p.sens[t.Name][key] = v
	return v, nil
}

// bytes is the exact stored size of t under c.
func (p *Planner) bytes(t TensorDesc, c Choice) (int64, error) {
	if c.Keep {
		return t.keptBytes(), nil
	}
	b := p.cost(c.Scheme, t.Shape[0], t.Shape[1])
	if b <= 0 {
		return 0, fmt.Errorf("tensor %s: cost function gave %d bytes for %s", t.Name, b, c)
	}
	return b, nil
}

// checkSupported says whether the output format holds c.
func (p *Planner) checkSupported(c Choice) error {
	if c.Keep || p.supports == nil {
		return nil
	}
	return p.supports(c.Scheme)
}

// verdict is a strategy's decision for one tensor before it becomes an Entry.
type verdict struct {
	choice    Choice
	reason    string
	pinned    bool
	candidate bool
}

// Plan makes a plan. The decisions common to every strategy (pins, non-candidates) are taken
// here; the strategy decides the free candidates.
func (p *Planner) Plan(opts Options) (*Plan, error) {
	ladder := opts.Ladder
	if len(ladder) == 0 {
		ladder = DefaultLadder(opts.Strategy)
	}
	if err := checkLadder(ladder); err != nil {
		return nil, err
	}
	p.used = map[string]map[string]float64{}
	pins, warnings, err := resolvePins(p.tensors, opts.Overrides)
	if err != nil {
		return nil, err
	}
	verdicts := make([]verdict, len(p.tensors))
	var free []int // indices of the candidates the strategy decides
	for i, t := range p.tensors {
		cand, why := isCandidate(t, opts)
		if pn, ok := pins[t.Name]; ok {
			if err := p.checkSupported(pn.choice); err != nil {
				return nil, fmt.Errorf("tensor %s: %s: %w", t.Name, pn.reason, err)
			}
			verdicts[i] = verdict{pn.choice, pn.reason, true, cand || !pn.choice.Keep}
			continue
		}
		if !cand {
			verdicts[i] = verdict{choice: Keep, reason: why}
			continue
		}
		verdicts[i].candidate = true
		free = append(free, i)
	}
	if err := p.checkTiedPins(opts.Tie, verdicts); err != nil {
		return nil, err
	}
	groups, err := p.tiedGroups(opts.Tie, free)
	if err != nil {
		return nil, err
	}
	plan := &Plan{Version: PlanVersion, Strategy: opts.Strategy, Warnings: warnings}
	for _, c := range ladder {
		plan.Ladder = append(plan.Ladder, c.String())
	}
	for _, o := range opts.Overrides {
		plan.Overrides = append(plan.Overrides, o.String())
	}
	switch opts.Strategy {
	case StrategyUniform:
		err = p.uniform(ladder, free, verdicts)
	case StrategyEvolved:
		err = p.evolved(ladder, opts, groups, verdicts)
	case StrategyBudget:
		plan.Budget, err = p.budget(ladder, opts, groups, verdicts, plan)
	default:
		err = fmt.Errorf("alloc: unknown strategy %q (want %s, %s or %s)", opts.Strategy,
			StrategyUniform, StrategyEvolved, StrategyBudget)
	}
	if err != nil {
		return nil, err
	}
	if err := p.applyFallbacks(opts.Fallback, verdicts); err != nil {
		return nil, err
	}
	if err := p.fillEntries(plan, verdicts); err != nil {
		return nil, err
	}
	return plan, nil
}

// isCandidate says whether t is quantized by default rules, and if not, why not.
func isCandidate(t TensorDesc, opts Options) (bool, string) {
	switch {
	case t.Role == model.RoleNorm:
		return false, "norm: never quantized"
	case t.Role == model.RoleRouter:
		return false, "MoE router: never quantized"
	case !t.isMatrix():
		return false, fmt.Sprintf("not a 2-D weight (shape %v)", t.Shape)
	case t.Role.IsLinear():
		return true, ""
	case t.Role == model.RoleEmbedding:
		return opts.QuantizeEmbeddings, "embedding: kept in input dtype (not opted in)"
	case t.Role == model.RoleClassifier:
		return opts.QuantizeHead, "classifier: protected, kept in input dtype (not opted in)"
	}
	return false, fmt.Sprintf("role %s: not a quantization candidate", t.Role)
}

func (p *Planner) uniform(ladder []Choice, free []int, verdicts []verdict) error {
	if len(ladder) != 1 {
		return fmt.Errorf("uniform strategy takes one scheme, the ladder has %d", len(ladder))
	}
	c := ladder[0]
	if err := p.checkSupported(c); err != nil {
		return fmt.Errorf("uniform scheme %s: %w", c, err)
	}
	for _, i := range free {
		verdicts[i].choice, verdicts[i].reason = c, "uniform: "+c.String()
	}
	return nil
}

// applyFallbacks replaces the choices the output format stores otherwise.
func (p *Planner) applyFallbacks(fb FallbackFunc, verdicts []verdict) error {
	if fb == nil {
		return nil
	}
	for i, t := range p.tensors {
		v := &verdicts[i]
		if v.choice.Keep || !t.isMatrix() {
			continue
		}
		c, why, err := fb(v.choice.Scheme, t.Shape[0], t.Shape[1])
		if err != nil {
			return fmt.Errorf("tensor %s: %s: %w", t.Name, v.choice, err)
		}
		if c != v.choice {
			v.choice, v.reason = c, v.reason+"; "+why
		}
	}
	return nil
}

// fillEntries turns verdicts into entries with exact sizes and the sensitivities measured.
func (p *Planner) fillEntries(plan *Plan, verdicts []verdict) error {
	var input int64
	plan.Entries = make([]Entry, len(p.tensors))
	for i, t := range p.tensors {
		v := verdicts[i]
		b, err := p.bytes(t, v.choice)
		if err != nil {
			return err
		}
		input += t.KeepBytes()
		sens := p.used[t.Name]
		plan.Entries[i] = Entry{Name: t.Name, Scheme: v.choice.String(), Reason: v.reason, Pinned: v.pinned,
			Candidate: v.candidate, Params: t.Params, Bytes: b, BPW: bitsPerWeight(b, t.Params), Sensitivity: sens}
	}
	plan.Totals = sumTotals(plan.Entries, input)
	return nil
}
