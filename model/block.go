package model

import (
	"errors"
	"fmt"
	"strconv"
)

// Group is a set of linear modules of a decoder block that read the same input, so they share
// one calibration Hessian XᵀX.
type Group int

const (
	GroupQKV    Group = iota // q_proj, k_proj, v_proj: the normed block input
	GroupO                   // o_proj: the attention output
	GroupGateUp              // gate_proj, up_proj: the normed post-attention hidden state
	GroupDown                // down_proj: silu(gate)·up
)

// Groups lists the groups in the order a block's forward pass reaches them.
var Groups = []Group{GroupQKV, GroupO, GroupGateUp, GroupDown}

var groupNames = [...]string{"qkv", "o", "gate_up", "down"}
var groupModules = [...][]string{{"q_proj", "k_proj", "v_proj"}, {"o_proj"}, {"gate_proj", "up_proj"}, {"down_proj"}}

func (g Group) String() string {
	if g >= 0 && int(g) < len(groupNames) {
		return groupNames[g]
	}
	return "group(" + strconv.Itoa(int(g)) + ")"
}

// Modules names the group's linears as they appear in tensor names ("q_proj", ...).
func (g Group) Modules() []string { return groupModules[g] }

// Hook, when non-nil, receives the input x [rows, cols] of each linear group during a block's
// forward pass; x is the forward's own buffer, valid only during the call. An error stops the pass.
type Hook func(g Group, x []float32, rows, cols int) error

// Block is one decoder block: pre-norm attention and a SiLU-gated MLP, each with a residual.
type Block struct {
	Index                   int
	InputNorm, PostAttnNorm []float32 // [Hidden]
	QNorm, KNorm            []float32 // [HeadDim], qwen3 only
	Q, K, V, O              *Linear
	Gate, Up, Down          *Linear

	cfg  *Config
	rope *ropeTable
}

func loadBlock(cfg *Config, w Weights, rope *ropeTable, i int) (*Block, error) {
	p := "model.layers." + strconv.Itoa(i) + "."
	b := &Block{Index: i, cfg: cfg, rope: rope}
	h, q, kv := cfg.Hidden, cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	var err error
	if b.InputNorm, err = loadTensor(w, p+"input_layernorm.weight", h); err != nil {
		return nil, err
	}
	if b.PostAttnNorm, err = loadTensor(w, p+"post_attention_layernorm.weight", h); err != nil {
		return nil, err
	}
	if cfg.QKNorm {
		if b.QNorm, err = loadTensor(w, p+"self_attn.q_norm.weight", cfg.HeadDim); err != nil {
			return nil, err
		}
		if b.KNorm, err = loadTensor(w, p+"self_attn.k_norm.weight", cfg.HeadDim); err != nil {
			return nil, err
		}
	}
	linears := []struct {
		dst     **Linear
		module  string
		out, in int
	}{
		{&b.Q, "self_attn.q_proj", q, h}, {&b.K, "self_attn.k_proj", kv, h}, {&b.V, "self_attn.v_proj", kv, h},
		{&b.O, "self_attn.o_proj", h, q}, {&b.Gate, "mlp.gate_proj", cfg.Intermediate, h},
		{&b.Up, "mlp.up_proj", cfg.Intermediate, h}, {&b.Down, "mlp.down_proj", h, cfg.Intermediate},
	}
	for _, l := range linears {
		if *l.dst, err = loadLinear(w, p+l.module, l.out, l.in); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func loadLinear(w Weights, module string, out, in int) (*Linear, error) {
	l := &Linear{Name: module, Out: out, In: in}
	var err error
	if l.W, err = loadTensor(w, module+".weight", out, in); err != nil {
		return nil, err
	}
	if l.Bias, err = loadOptional(w, module+".bias", out); err != nil {
		return nil, err
	}
	return l, nil
}

// Linears returns the group's modules, in the order of g.Modules().
func (b *Block) Linears(g Group) []*Linear {
	switch g {
	case GroupQKV:
		return []*Linear{b.Q, b.K, b.V}
	case GroupO:
		return []*Linear{b.O}
	case GroupGateUp:
		return []*Linear{b.Gate, b.Up}
	case GroupDown:
		return []*Linear{b.Down}
	}
	return nil
}

// Linear returns the module with the short name ("q_proj", ..., "down_proj").
func (b *Block) Linear(module string) (*Linear, error) {
	for _, g := range Groups {
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

// MLP is down(silu(gate(h))·up(h)) on the normed input h [T, Hidden]; it writes out [T, Hidden].
func (b *Block) MLP(out, h []float32, T int, hook Hook) error {
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
