package model

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"

	"golang.org/x/sync/errgroup"
)

// Group is a set of linear modules of a decoder block that read the same input, so they share
// one calibration Hessian XᵀX. A dense block has the four below; a mixture-of-experts block has
// GroupQKV, GroupO, GroupGateUp (every token's normed hidden state: the router's input, and the
// shared expert's), two groups per expert (ExpertGateUp, ExpertDown: the inputs of the tokens
// routed to it) and, with a shared expert, GroupDown (its down_proj's input).
type Group int

const (
	GroupQKV    Group = iota // q_proj, k_proj, v_proj: the normed block input
	GroupO                   // o_proj: the attention output
	GroupGateUp              // gate_proj, up_proj: the normed post-attention hidden state
	GroupDown                // down_proj: silu(gate)·up
)

// Groups lists the groups of a dense block in the order its forward pass reaches them.
var Groups = []Group{GroupQKV, GroupO, GroupGateUp, GroupDown}

// ExpertGateUp is the group of expert e's gate and up projections.
func ExpertGateUp(e int) Group { return Group(4 + 2*e) }

// ExpertDown is the group of expert e's down projection.
func ExpertDown(e int) Group { return Group(5 + 2*e) }

// Expert returns the expert of an expert's group.
func (g Group) Expert() (int, bool) {
	if g < 4 {
		return 0, false
	}
	return int(g-4) / 2, true
}

// Stage is where in the block the group's input is made: 0 q/k/v, 1 o, 2 the MLP's (or the
// experts') gate and up, 3 their down. Groups of one stage can be quantized together: none
// reads another's output.
func (g Group) Stage() int {
	if _, ok := g.Expert(); ok {
		return 2 + int(g-4)%2
	}
	return int(g)
}

var groupNames = [...]string{"qkv", "o", "gate_up", "down"}
var groupModules = [...][]string{{"q_proj", "k_proj", "v_proj"}, {"o_proj"}, {"gate_proj", "up_proj"}, {"down_proj"}}

func (g Group) String() string {
	if e, ok := g.Expert(); ok {
		return "expert" + strconv.Itoa(e) + "." + groupNames[g.Stage()]
	}
	if g >= 0 {
		return groupNames[g]
	}
	return "group(" + strconv.Itoa(int(g)) + ")"
}

// Modules names the group's linears as they appear in dense blocks' tensor names ("q_proj", ...;
// an expert's as Qwen names them).
func (g Group) Modules() []string { return groupModules[g.Stage()] }

// Hook, when non-nil, receives the input x [rows, cols] of each linear group during a block's
// forward pass, in the order of Block.Groups; x is the forward's own buffer, valid only during
// the call. An expert's groups are reported even when no token was routed to it (rows 0). An
// error stops the pass.
type Hook func(g Group, x []float32, rows, cols int) error

// Block is one decoder block: pre-norm attention and a SiLU-gated MLP (or a mixture of
// experts), each with a residual.
type Block struct {
	Index                   int
	InputNorm, PostAttnNorm []float32 // [Hidden]
	QNorm, KNorm            []float32 // [HeadDim], qwen3 only
	Q, K, V, O              *Linear
	Gate, Up, Down          *Linear // the dense MLP; nil in a mixture-of-experts block
	MoE                     *MoE    // the experts; nil in a dense block

	cfg   *Config
	rope  *ropeTable
	owned [][]float32 // the slices read into memory the model may reuse (Model.RecycleBlock)
	// releaseRawPages lets the pages of the checkpoint's bytes that raw linears view leave the
	// process's resident memory once they are on the GPUs (they come back from the page cache
	// if read again); nil without raw linears.
	releaseRawPages func()
}

// loadBlock reads block i through r, its linears (and experts) several at once.
func loadBlock(cfg *Config, r *tensorReader, rope *ropeTable, i int) (*Block, error) {
	p := "model.layers." + strconv.Itoa(i) + "."
	b := &Block{Index: i, cfg: cfg, rope: rope}
	h, q, kv := cfg.Hidden, cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	var err error
	if b.InputNorm, err = r.tensor(p+"input_layernorm.weight", h); err != nil {
		return nil, err
	}
	if b.PostAttnNorm, err = r.tensor(p+"post_attention_layernorm.weight", h); err != nil {
		return nil, err
	}
	if cfg.QKNorm {
		if b.QNorm, err = r.tensor(p+"self_attn.q_norm.weight", cfg.HeadDim); err != nil {
			return nil, err
		}
		if b.KNorm, err = r.tensor(p+"self_attn.k_norm.weight", cfg.HeadDim); err != nil {
			return nil, err
		}
	}
	type linear struct {
		dst     **Linear
		module  string
		out, in int
	}
	linears := []linear{
		{&b.Q, "self_attn.q_proj", q, h}, {&b.K, "self_attn.k_proj", kv, h}, {&b.V, "self_attn.v_proj", kv, h},
		{&b.O, "self_attn.o_proj", h, q},
	}
	var reads errgroup.Group
	readers := r.readers
	if readers == 0 {
		readers = blockReaders(cfg.SparseBlock(i))
	}
	reads.SetLimit(readers)
	if cfg.SparseBlock(i) {
		if b.MoE, err = loadMoE(cfg, r, i, &reads); err != nil { // (refused before any read is queued)
			return nil, err
		}
	} else {
		linears = append(linears, linear{&b.Gate, "mlp.gate_proj", cfg.Intermediate, h},
			linear{&b.Up, "mlp.up_proj", cfg.Intermediate, h}, linear{&b.Down, "mlp.down_proj", h, cfg.Intermediate})
	}
	for _, l := range linears {
		reads.Go(func() (err error) {
			*l.dst, err = r.linear(p+l.module, l.out, l.in)
			return err
		})
	}
	if err := reads.Wait(); err != nil {
		return nil, err
	}
	b.owned = r.owned
	if rl, ok := r.w.(releaser); ok && r.raw {
		b.releaseRawPages = func() {
			for _, l := range b.AllLinears() {
				if l.raw.data != nil {
					rl.Release(l.Name + ".weight")
				}
			}
		}
	}
	return b, nil
}

// releaseRaw releases the pages the block's raw linears view, if it has any (their bytes are
// uploaded).
func (b *Block) releaseRaw() {
	if b.releaseRawPages != nil {
		b.releaseRawPages()
	}
}

// blockReaders is how many of a block's linears are read and converted at once: one for a
// dense block, several for a block of experts. Read by one thread, a Mixtral block (2.9 GB of
// BF16) took 1.3 s, longer than its calibration on four H100s, which waited 0.5 s a block for
// it; eight threads convert 3.3 times as fast (BenchmarkBlockRead, 64 cores). A dense block's
// read is hidden behind the calibration of the one before; read by eight threads, the GPTQ
// steps of a 7B on four H100s took 0.1-0.35 s longer in all (two runs each way, one call).
func blockReaders(experts bool) int {
	if !experts {
		return 1
	}
	return min(maxBlockReaders, runtime.GOMAXPROCS(0))
}

// maxBlockReaders bounds blockReaders (a benchmark sets it to 1 for the serial read).
var maxBlockReaders = 8

func loadLinear(w Weights, module string, out, in int) (*Linear, error) {
	return (&tensorReader{w: w}).linear(module, out, in)
}

func (r *tensorReader) linear(module string, out, in int) (*Linear, error) {
	l := &Linear{Name: module, Out: out, In: in}
	var raw bool
	var err error
	if r.raw && ParseTensorName(module+".weight").Role.IsLinear() { // (a router's logits are routed on the host)
		if l.raw, raw, err = r.rawTensor(module+".weight", out, in); err != nil {
			return nil, err
		}
	}
	if !raw {
		if l.W, err = r.tensor(module+".weight", out, in); err != nil {
			return nil, err
		}
	}
	if l.Bias, err = r.optional(module+".bias", out); err != nil {
		return nil, err
	}
	return l, nil
}

// Groups lists the block's groups in the order its forward pass reaches them.
func (b *Block) Groups() []Group {
	if b.MoE == nil {
		return Groups
	}
	var gs []Group
	for _, st := range b.Stages() {
		gs = append(gs, st...)
	}
	return gs
}

// Stages lists the block's groups stage by stage (Group.Stage), in forward order: what
// true-sequential calibration quantizes together.
func (b *Block) Stages() [][]Group {
	if b.MoE == nil {
		return [][]Group{{GroupQKV}, {GroupO}, {GroupGateUp}, {GroupDown}}
	}
	gateUp, down := []Group{GroupGateUp}, []Group{}
	for e := range b.MoE.Experts {
		gateUp, down = append(gateUp, ExpertGateUp(e)), append(down, ExpertDown(e))
	}
	if b.MoE.Shared != nil {
		down = append(down, GroupDown)
	}
	return [][]Group{{GroupQKV}, {GroupO}, gateUp, down}
}

// Linears returns the group's modules: in a dense block in the order of g.Modules(); in a
// mixture-of-experts block see MoE.linears.
func (b *Block) Linears(g Group) []*Linear {
	switch g {
	case GroupQKV:
		return []*Linear{b.Q, b.K, b.V}
	case GroupO:
		return []*Linear{b.O}
	}
	if b.MoE != nil {
		return b.MoE.linears(g)
	}
	switch g {
	case GroupGateUp:
		return []*Linear{b.Gate, b.Up}
	case GroupDown:
		return []*Linear{b.Down}
	}
	return nil
}

// AllLinears lists every linear of the block, group by group in forward order.
func (b *Block) AllLinears() []*Linear {
	var ls []*Linear
	for _, g := range b.Groups() {
		ls = append(ls, b.Linears(g)...)
	}
	return ls
}

// Linear returns the module with the full name ("model.layers.0.mlp.experts.3.down_proj"), or
// of a dense block's attention and MLP the short one ("q_proj", ..., "down_proj").
func (b *Block) Linear(module string) (*Linear, error) {
	for _, l := range b.AllLinears() {
		if l.Name == module {
			return l, nil
		}
	}
	for _, g := range Groups {
		if b.MoE != nil && g.Stage() >= GroupGateUp.Stage() {
			break
		}
		for i, name := range g.Modules() {
			if name == module {
				return b.Linears(g)[i], nil
			}
		}
	}
	return nil, fmt.Errorf("model: block %d has no linear module %q", b.Index, module)
}

// errStopForward ends a forward pass early from a Hook, when the rest is not needed.
var errStopForward = errors.New("model: forward stopped by hook")

// Forward runs the block over x [T, Hidden] in place (one sequence, causal).
func (b *Block) Forward(x []float32, T int, hook Hook) error { return b.forward(x, T, hook, nil) }

// forward is Forward with an optional cache of the attention output (o_proj's input) for this
// x: a nil *attn is filled; a non-nil one is used instead of the q/k/v projections and the
// attention (their hook is then not called), valid as long as q/k/v and the input norm are the
// weights it was computed with.
func (b *Block) forward(x []float32, T int, hook Hook, attn *[]float32) error {
	hid := b.cfg.Hidden
	if len(x) != T*hid {
		return fmt.Errorf("model: block %d: input has %d values, want %d×%d", b.Index, len(x), T, hid)
	}
	h := make([]float32, T*hid)
	out := make([]float32, T*hid)
	rmsNorm(h, x, b.InputNorm, T, hid, b.cfg.RMSNormEps)
	if err := b.attention(out, h, T, hook, attn); err != nil {
		return err
	}
	addTo(x, out)
	rmsNorm(h, x, b.PostAttnNorm, T, hid, b.cfg.RMSNormEps)
	if err := b.MLP(out, h, T, hook); err != nil {
		return err
	}
	addTo(x, out)
	return nil
}

// Attention is the self-attention module (projections, rotary, causal GQA attention, o_proj)
// on the normed input h [T, Hidden]; it writes out [T, Hidden].
func (b *Block) Attention(out, h []float32, T int, hook Hook) error {
	return b.attention(out, h, T, hook, nil)
}

// attention is Attention with forward's optional cache of o_proj's input.
func (b *Block) attention(out, h []float32, T int, hook Hook, cache *[]float32) error {
	var a []float32
	if cache != nil && *cache != nil {
		a = *cache
	} else {
		var err error
		if a, err = b.attend(h, T, hook); err != nil {
			return err
		}
		if cache != nil {
			*cache = a
		}
	}
	if err := callHook(hook, GroupO, a, T, b.O.In); err != nil {
		return err
	}
	b.O.Forward(out, a, T)
	return nil
}

// attend computes o_proj's input from the normed input h: q/k/v projections (their hook
// first), norms, rotary and causal GQA attention.
func (b *Block) attend(h []float32, T int, hook Hook) ([]float32, error) {
	c := b.cfg
	if err := callHook(hook, GroupQKV, h, T, c.Hidden); err != nil {
		return nil, err
	}
	q := make([]float32, T*b.Q.Out)
	k := make([]float32, T*b.K.Out)
	v := make([]float32, T*b.V.Out)
	b.Q.Forward(q, h, T)
	b.K.Forward(k, h, T)
	b.V.Forward(v, h, T)
	if c.QKNorm {
		rmsNorm(q, q, b.QNorm, T*c.Heads, c.HeadDim, c.RMSNormEps)
		rmsNorm(k, k, b.KNorm, T*c.KVHeads, c.HeadDim, c.RMSNormEps)
	}
	cos, sin := b.rope.get(T)
	applyRope(q, cos, sin, T, c.Heads, c.HeadDim)
	applyRope(k, cos, sin, T, c.KVHeads, c.HeadDim)
	a := make([]float32, T*b.O.In)
	attention(a, q, k, v, T, c.Heads, c.KVHeads, c.HeadDim, c.SlidingWindow[b.Index])
	return a, nil
}

// MLP is down(silu(gate(h))·up(h)), or the mixture of experts, on the normed input h
// [T, Hidden]; it writes out [T, Hidden].
func (b *Block) MLP(out, h []float32, T int, hook Hook) error {
	if b.MoE != nil {
		return b.MoE.forward(out, h, T, b.cfg.Hidden, hook)
	}
	if err := callHook(hook, GroupGateUp, h, T, b.cfg.Hidden); err != nil {
		return err
	}
	g := make([]float32, T*b.Gate.Out)
	u := make([]float32, T*b.Up.Out)
	b.Gate.Forward(g, h, T)
	b.Up.Forward(u, h, T)
	siluMul(g, u)
	if err := callHook(hook, GroupDown, g, T, b.Down.In); err != nil {
		return err
	}
	b.Down.Forward(out, g, T)
	return nil
}

func callHook(hook Hook, g Group, x []float32, rows, cols int) error {
	if hook == nil {
		return nil
	}
	return hook(g, x, rows, cols)
}

func addTo(x, y []float32) {
	y = y[:len(x)]
	for i := range x {
		x[i] += y[i]
	}
}
