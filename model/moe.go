package model

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"golang.org/x/sync/errgroup"
)

// parseMoE reads the mixture-of-experts keys of the MoE families; a dense family has none.
func parseMoE(r *rawConfig, layers int) (MoEConfig, error) {
	var m MoEConfig
	switch r.ModelType {
	case "mixtral", "qwen2_moe", "qwen3_moe":
	default:
		return m, nil
	}
	geti := func(p *int) int {
		if p == nil {
			return 0
		}
		return *p
	}
	m.Experts = geti(r.NumLocalExperts)
	if r.NumExperts != nil {
		m.Experts = *r.NumExperts
	}
	m.TopK = geti(r.ExpertsPerToken)
	m.Intermediate = geti(r.MoEIntermediate)
	if r.ModelType == "mixtral" {
		m.Intermediate, m.NormTopK = r.Intermediate, true
	} else {
		m.SharedIntermediate = geti(r.SharedIntermediate)
		m.NormTopK = r.NormTopK != nil && *r.NormTopK // transformers' default is false
	}
	if m.Experts <= 0 {
		return m, fmt.Errorf("config: %s needs a positive num_experts (or num_local_experts), got %d", r.ModelType, m.Experts)
	}
	if m.TopK <= 0 || m.TopK > m.Experts {
		return m, fmt.Errorf("config: num_experts_per_tok %d must be between 1 and the %d experts", m.TopK, m.Experts)
	}
	if m.Intermediate <= 0 {
		return m, fmt.Errorf("config: %s needs a positive moe_intermediate_size, got %d", r.ModelType, m.Intermediate)
	}
	if m.SharedIntermediate < 0 {
		return m, fmt.Errorf("config: shared_expert_intermediate_size %d is negative", m.SharedIntermediate)
	}
	step := 1
	if r.SparseStep != nil {
		step = *r.SparseStep
	}
	if step <= 0 && r.ModelType != "mixtral" {
		return m, fmt.Errorf("config: decoder_sparse_step must be positive, got %d", step)
	}
	m.Sparse = make([]bool, layers)
	for i := range m.Sparse {
		// transformers: not in mlp_only_layers and (i+1) % decoder_sparse_step == 0 (Qwen);
		// every block of Mixtral.
		m.Sparse[i] = r.ModelType == "mixtral" || (i+1)%step == 0
	}
	for _, i := range r.MLPOnlyLayers {
		if i < 0 || i >= layers {
			return m, fmt.Errorf("config: mlp_only_layers names block %d of %d", i, layers)
		}
		m.Sparse[i] = false
	}
	return m, nil
}

// blockLinears is how many linears block i has: 7 in a dense block; in a mixture of experts 4
// in the attention, the router, 3 per expert and 4 for a shared expert with its gate.
func (c *Config) blockLinears(i int) int {
	if !c.SparseBlock(i) {
		return 7
	}
	n := 5 + 3*c.MoE.Experts
	if c.MoE.SharedIntermediate > 0 {
		n += 4
	}
	return n
}

// maxBlockLinears is the most linears a block of the model has.
func (c *Config) maxBlockLinears() int {
	n := 0
	for i := range c.Layers {
		n = max(n, c.blockLinears(i))
	}
	return n
}

// allLinears is how many linears the blocks have.
func (c *Config) allLinears() int {
	n := 0
	for i := range c.Layers {
		n += c.blockLinears(i)
	}
	return n
}

// linears is how many decoder linears the model has, routers and shared-expert gates left out
// (the linears quantization targets, Role.IsLinear): the probe's progress total.
func (c *Config) linears() int {
	n := 0
	for i := range c.Layers {
		n += c.blockLinears(i)
		if c.SparseBlock(i) {
			n-- // the router
			if c.MoE.SharedIntermediate > 0 {
				n-- // the shared expert's gate
			}
		}
	}
	return n
}

// MoE is a block's mixture-of-experts MLP: a router (a linear from the hidden state to one
// logit per expert) sends each token to its TopK most likely experts, each a SiLU-gated MLP, and
// the block's MLP output is their outputs weighted by the routing probabilities (renormalized
// over the chosen ones when NormTopK), plus, in Qwen2-MoE, a shared expert every token goes
// through, scaled by sigmoid(SharedGate·h).
type MoE struct {
	Router     *Linear   // [Experts, Hidden]
	Experts    []*Expert // Gate and Up [Intermediate, Hidden], Down [Hidden, Intermediate]
	Shared     *Expert   // nil without a shared expert
	SharedGate *Linear   // [1, Hidden]; nil without a shared expert
	TopK       int
	NormTopK   bool

	observe expertObserver // how a calibration observes the experts' inputs (set during one)
}

// ExpertObservation says how a calibration observes the inputs of experts' groups.
type ExpertObservation struct {
	// AllTokens, when set, is asked before each pass that observes expert e's down_proj input
	// in block: true makes the observed input silu(gate(h))·up(h) of every token instead of the
	// tokens routed to e (the router still decides the block's output). The expert's gate/up
	// input over every token is GroupGateUp's. Calibrate observes a step's down inputs of a
	// block of experts in a pass after all of its gate/up inputs, so the calibrator knows how
	// many tokens reached each expert when it answers.
	AllTokens func(block, expert int) bool
	// WeightPower p > 0 multiplies each routed row that an expert's groups observe by w^(p/2),
	// w the token's routing weight to the expert, so that their Gram matrices are Σ w^p·x·xᵀ:
	// the expert's output reaches the block's scaled by w, so its squared error by w².
	WeightPower float64
	// GateUpAgain, when set, is asked before each step of block that observes the experts'
	// gate/up inputs in one pass and down inputs in a second: true hands the gate/up inputs
	// again in the second pass, before the down inputs. On several GPUs a calibrator that keeps
	// an expert's rows by their index among all the GPUs' tokens routed to it learns between the
	// passes how many each GPU routed (PassEnder) and keeps them in the second.
	GateUpAgain func(block int) bool
}

// expertObserver is an ExpertObservation bound to one block.
type expertObserver struct {
	all   func(expert int) bool
	again func() bool
	power float64
}

func (o ExpertObservation) forBlock(block int) expertObserver {
	ob := expertObserver{power: o.WeightPower}
	if o.AllTokens != nil {
		ob.all = func(e int) bool { return o.AllTokens(block, e) }
	}
	if o.GateUpAgain != nil {
		ob.again = func() bool { return o.GateUpAgain(block) }
	}
	return ob
}

// observing sets how b's experts are observed (nothing for a dense block) and returns the
// function that resets it.
func (b *Block) observing(o ExpertObservation) (reset func()) {
	if b.MoE == nil {
		return func() {}
	}
	b.MoE.observe = o.forBlock(b.Index)
	return func() { b.MoE.observe = expertObserver{} }
}

// allTokens says whether expert e's down input is observed over every token.
func (o expertObserver) allTokens(e int) bool { return o.all != nil && o.all(e) }

// gateUpAgain says whether the experts' gate/up inputs are handed again in the down pass.
func (o expertObserver) gateUpAgain() bool { return o.again != nil && o.again() }

// Expert is one SiLU-gated MLP: down(silu(gate(x))·up(x)).
type Expert struct{ Gate, Up, Down *Linear }

// ExpertNames are the checkpoint names (without ".weight") of a sparse block's experts.
type ExpertNames struct {
	Router         string    // [Experts, Hidden]
	Gate, Up, Down []string  // per expert
	Shared         [3]string // the shared expert's gate, up and down; empty without one
	SharedGate     string    // [1, Hidden]; empty without a shared expert
	Fused          string    // transformers 5's in-memory fused experts (gate_up_proj), which qpack refuses
}

// Mixtral's layout: block_sparse_moe.gate, block_sparse_moe.experts.N.w1 (gate), w3 (up), w2
// (down). Qwen2/3-MoE's (and Mixtral's as some converters write it): mlp.gate,
// mlp.experts.N.gate_proj, up_proj, down_proj, and mlp.shared_expert.*, mlp.shared_expert_gate.
const mixtralPrefix = "block_sparse_moe."

// MoENames gives the tensor names of block i's experts in the layout the checkpoint uses:
// Mixtral's when has reports its router there, else Qwen's.
func (c *Config) MoENames(i int, has func(name string) bool) ExpertNames {
	p := "model.layers." + strconv.Itoa(i) + "."
	mixtral := has(p + mixtralPrefix + "gate.weight")
	pre, gate, up, down := p+"mlp.", "gate_proj", "up_proj", "down_proj"
	if mixtral {
		pre, gate, up, down = p+mixtralPrefix, "w1", "w3", "w2"
	}
	n := ExpertNames{Router: pre + "gate", Fused: pre + "experts.gate_up_proj"}
	for e := range c.MoE.Experts {
		x := pre + "experts." + strconv.Itoa(e) + "."
		n.Gate, n.Up, n.Down = append(n.Gate, x+gate), append(n.Up, x+up), append(n.Down, x+down)
	}
	if c.MoE.SharedIntermediate > 0 {
		s := pre + "shared_expert."
		n.Shared = [3]string{s + "gate_proj", s + "up_proj", s + "down_proj"}
		n.SharedGate = pre + "shared_expert_gate"
	}
	return n
}

// loadMoE queues on reads the reading of block i's router and experts (into r's memory), in
// whichever layout the checkpoint has; they are read once reads is waited for.
func loadMoE(cfg *Config, r *tensorReader, i int, reads *errgroup.Group) (*MoE, error) {
	w := r.w
	names := cfg.MoENames(i, func(name string) bool { _, ok := w.Shape(name); return ok })
	if _, ok := w.Shape(names.Fused); ok {
		return nil, fmt.Errorf("model: %s: fused expert tensors are not supported; save the checkpoint with one tensor per expert (%s.weight ...)", names.Fused, names.Gate[0])
	}
	c := cfg.MoE
	m := &MoE{TopK: c.TopK, NormTopK: c.NormTopK, Experts: make([]*Expert, c.Experts)}
	read := func(dst **Linear, module string, out, in int) {
		reads.Go(func() (err error) {
			*dst, err = r.linear(module, out, in)
			return err
		})
	}
	read(&m.Router, names.Router, c.Experts, cfg.Hidden)
	expert := func(names [3]string, inter int) *Expert {
		x := &Expert{}
		read(&x.Gate, names[0], inter, cfg.Hidden)
		read(&x.Up, names[1], inter, cfg.Hidden)
		read(&x.Down, names[2], cfg.Hidden, inter)
		return x
	}
	for e := range c.Experts {
		m.Experts[e] = expert([3]string{names.Gate[e], names.Up[e], names.Down[e]}, c.Intermediate)
	}
	if c.SharedIntermediate > 0 {
		m.Shared = expert(names.Shared, c.SharedIntermediate)
		read(&m.SharedGate, names.SharedGate, 1, cfg.Hidden)
	}
	return m, nil
}

// Routes are the experts chosen for each of T tokens and their weights: token t goes to
// Expert[t·K+j] with weight Weight[t·K+j], j < K, in increasing expert order (the order in
// which transformers adds the experts' outputs).
type Routes struct {
	T, K   int
	Expert []int
	Weight []float32
}

// route picks each token's top-k experts from the router logits [T, E] as transformers does:
// softmax over all experts (in float32), the k most probable (ties to the lower index), and,
// when norm, those k probabilities divided by their sum.
func route(logits []float32, T, E, k int, norm bool) Routes {
	r := Routes{T: T, K: k, Expert: make([]int, T*k), Weight: make([]float32, T*k)}
	p := make([]float32, E)
	for t := range T {
		softmax32(p, logits[t*E:(t+1)*E])
		ex, wt := r.Expert[t*k:(t+1)*k], r.Weight[t*k:(t+1)*k]
		topK(ex, p)
		slices.Sort(ex)
		var sum float32
		for j, e := range ex {
			wt[j] = p[e]
			sum += p[e]
		}
		if norm {
			for j := range wt {
				wt[j] /= sum
			}
		}
	}
	return r
}

// softmax32 writes the softmax of x into p, exp in float64 and the result rounded to float32.
func softmax32(p, x []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range x {
		mx = max(mx, v)
	}
	var sum float64
	for i, v := range x {
		e := math.Exp(float64(v - mx))
		p[i] = float32(e)
		sum += e
	}
	for i := range p {
		p[i] = float32(float64(p[i]) / sum)
	}
}

// topK fills ex with the indices of the len(ex) largest values of p, the lower index first
// among equal values.
func topK(ex []int, p []float32) {
	for j := range ex {
		best := -1
		for i, v := range p {
			if (best < 0 || v > p[best]) && !slices.Contains(ex[:j], i) {
				best = i
			}
		}
		ex[j] = best
	}
}

// expertPlan lays a routing out for running each expert once over all its tokens: the T·K
// (token, expert) pairs sorted by expert, tokens ascending within one, so that expert e's rows
// are one slice [start[e], start[e+1]) of the gathered inputs and of the outputs Z; a shared
// expert's outputs follow them in Z (rows T·K + t). Each token's output is then
// Σ_j weight[t·slots+j]·Z[pos[t·slots+j]] over its slots (its K experts in increasing order,
// then the shared expert).
type expertPlan struct {
	start     []int     // [E+1]
	token     []int32   // [T·K]: the token of each row
	rowWeight []float32 // [T·K]: the routing weight of each row
	pos       []int32   // [T·slots]: the row of Z of each of token t's outputs
	weight    []float32 // [T·slots]: their weights (the shared expert's is filled in later)
	slots     int       // K, plus one with a shared expert
}

func (r Routes) plan(E int, shared bool) expertPlan {
	p := expertPlan{start: make([]int, E+1), token: make([]int32, r.T*r.K), rowWeight: make([]float32, r.T*r.K), slots: r.K}
	if shared {
		p.slots++
	}
	p.pos, p.weight = make([]int32, r.T*p.slots), make([]float32, r.T*p.slots)
	for _, e := range r.Expert {
		p.start[e+1]++
	}
	for e := range E {
		p.start[e+1] += p.start[e]
	}
	next := slices.Clone(p.start[:E])
	for t := range r.T {
		for j := range r.K {
			e := r.Expert[t*r.K+j]
			row := next[e]
			next[e]++
			p.token[row], p.rowWeight[row] = int32(t), r.Weight[t*r.K+j]
			p.pos[t*p.slots+j], p.weight[t*p.slots+j] = int32(row), r.Weight[t*r.K+j]
		}
		if shared {
			p.pos[t*p.slots+r.K] = int32(r.T*r.K + t)
		}
	}
	return p
}

// Route computes the routing of the normed hidden states h [T, Hidden] by the block's router.
func (m *MoE) Route(h []float32, T int) Routes {
	E := len(m.Experts)
	logits := make([]float32, T*E)
	m.Router.Forward(logits, h, T)
	return route(logits, T, E, m.TopK, m.NormTopK)
}

// forward is the mixture of experts on the normed input h [T, Hidden]; it writes out
// [T, Hidden]. The hook sees, in order: every token's h (GroupGateUp: the router's and the
// shared expert's input), each expert's gate/up input (the rows of h routed to it, possibly
// none), each expert's down input, and the shared expert's down input (GroupDown). The GPU
// runs the same steps (GPU.moe).
func (m *MoE) forward(out, h []float32, T, hidden int, hook Hook) error {
	if err := callHook(hook, GroupGateUp, h, T, hidden); err != nil {
		return err
	}
	p := m.Route(h, T).plan(len(m.Experts), m.Shared != nil)
	rows, inter := len(p.token), m.Experts[0].Gate.Out
	x := make([]float32, rows*hidden)
	for i, t := range p.token {
		copy(x[i*hidden:(i+1)*hidden], h[int(t)*hidden:(int(t)+1)*hidden])
	}
	// Every expert's input is observed before any is computed (and every down input before
	// any down product), so a pass the hook stops after the last of them computes no more.
	for e := range m.Experts {
		a, b := p.start[e], p.start[e+1]
		if hook != nil {
			if err := hook(ExpertGateUp(e), m.observe.weighted(x[a*hidden:b*hidden], p.rowWeight[a:b], hidden), b-a, hidden); err != nil {
				return err
			}
		}
	}
	g, u := make([]float32, rows*inter), make([]float32, rows*inter)
	for e, ex := range m.Experts {
		if a, b := p.start[e], p.start[e+1]; a < b {
			ex.Gate.Forward(g[a*inter:b*inter], x[a*hidden:b*hidden], b-a)
			ex.Up.Forward(u[a*inter:b*inter], x[a*hidden:b*hidden], b-a)
		}
	}
	siluMul(g, u)
	for e := range m.Experts {
		a, b := p.start[e], p.start[e+1]
		if hook != nil {
			if err := m.observeDown(hook, e, g[a*inter:b*inter], p.rowWeight[a:b], h, T); err != nil {
				return err
			}
		}
	}
	z := make([]float32, (rows+T)*hidden) // the experts' outputs, then the shared expert's
	for e, ex := range m.Experts {
		if a, b := p.start[e], p.start[e+1]; a < b {
			ex.Down.Forward(z[a*hidden:b*hidden], g[a*inter:b*inter], b-a)
		}
	}
	if m.Shared != nil {
		if err := m.sharedForward(z[rows*hidden:], p, h, T, hidden, hook); err != nil {
			return err
		}
	}
	for t := range T {
		or := out[t*hidden : (t+1)*hidden]
		clear(or)
		for j := range p.slots {
			w, zr := p.weight[t*p.slots+j], z[int(p.pos[t*p.slots+j])*hidden:][:len(or)]
			for i := range or {
				or[i] += w * zr[i]
			}
		}
	}
	return nil
}

// observeDown hands the hook expert e's down input: act, its routed rows' silu(gate)·up, or
// with AllTokens that of every token of h [T, Hidden].
func (m *MoE) observeDown(hook Hook, e int, act []float32, weights []float32, h []float32, T int) error {
	x := m.Experts[e]
	if !m.observe.allTokens(e) {
		return hook(ExpertDown(e), m.observe.weighted(act, weights, x.Down.In), len(weights), x.Down.In)
	}
	return hook(ExpertDown(e), x.activation(h, T), T, x.Down.In)
}

// activation is silu(gate(h))·up(h) for h [T, Hidden]: the expert's down input.
func (x *Expert) activation(h []float32, T int) []float32 {
	g, u := make([]float32, T*x.Gate.Out), make([]float32, T*x.Up.Out)
	x.Gate.Forward(g, h, T)
	x.Up.Forward(u, h, T)
	siluMul(g, u)
	return g
}

// weighted returns the rows of x [len(w), cols] as observed: x itself, or under WeightPower p
// a copy with row i multiplied by w[i]^(p/2).
func (o expertObserver) weighted(x, w []float32, cols int) []float32 {
	if o.power == 0 {
		return x
	}
	out := make([]float32, len(x))
	for i, wi := range w {
		f := float32(math.Pow(float64(wi), o.power/2))
		for j, v := range x[i*cols : (i+1)*cols] {
			out[i*cols+j] = f * v
		}
	}
	return out
}

// sharedForward writes the shared expert's outputs for h [T, Hidden] into y and its weights,
// sigmoid(SharedGate·h), into p (Qwen2-MoE).
func (m *MoE) sharedForward(y []float32, p expertPlan, h []float32, T, hidden int, hook Hook) error {
	x := m.Shared
	g := x.activation(h, T)
	if err := callHook(hook, GroupDown, g, T, x.Down.In); err != nil {
		return err
	}
	x.Down.Forward(y[:T*hidden], g, T)
	gate := make([]float32, T)
	m.SharedGate.Forward(gate, h, T)
	for t, v := range gate {
		p.weight[t*p.slots+p.slots-1] = sigmoid(v)
	}
	return nil
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// linears lists the MoE's linears of group g: the router and the shared expert's gate, gate
// and up (GroupGateUp), the shared expert's down (GroupDown), or an expert's.
func (m *MoE) linears(g Group) []*Linear {
	if e, ok := g.Expert(); ok {
		if e >= len(m.Experts) {
			return nil
		}
		x := m.Experts[e]
		if g.Stage() == GroupDown.Stage() {
			return []*Linear{x.Down}
		}
		return []*Linear{x.Gate, x.Up}
	}
	switch g {
	case GroupGateUp:
		ls := []*Linear{m.Router}
		if m.Shared != nil {
			ls = append(ls, m.SharedGate, m.Shared.Gate, m.Shared.Up)
		}
		return ls
	case GroupDown:
		if m.Shared != nil {
			return []*Linear{m.Shared.Down}
		}
	}
	return nil
}
