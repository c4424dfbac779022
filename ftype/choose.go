package ftype

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/qpack-dev/qpack/gguf"
)

// Model is what llama-quantize reads of a model besides its tensors.
type Model struct {
	Arch    string // llama.cpp's architecture name: "llama", "qwen2", "falcon", …
	Layers  int    // n_layer
	Heads   int    // n_head of layer 0
	KVHeads int    // n_head_kv of layer 0
	Experts int    // n_expert (0 for a dense model)
	// Is70B is llama.cpp's model type being LLM_TYPE_70B (see Is70B).
	Is70B bool
}

// Is70B reports whether llama.cpp classifies a model as 70B (load_hparams in
// src/llama-model.cpp): 80 layers, and for llama grouped-query attention and no 8 experts.
func Is70B(arch string, layers, heads, kvHeads, experts int) bool {
	switch arch {
	case "llama":
		return layers == 80 && experts != 8 && heads != kvHeads
	case "qwen2", "deci", "olmo":
		return layers == 80
	}
	return false
}

func (m Model) gqa() int {
	if m.KVHeads == 0 {
		return 0
	}
	return m.Heads / m.KVHeads
}

// Tensor is one tensor of the model as it is in the input file.
type Tensor struct {
	Name string    // llama.cpp's name, e.g. "blk.3.ffn_down.weight"
	Type gguf.Type // its type in the input
	Dims []uint64  // ne, innermost first
}

// Options are llama-quantize's switches that change the choice.
type Options struct {
	Imatrix     bool       // an importance matrix is given (--imatrix)
	EmbedType   *gguf.Type // --token-embedding-type
	OutputType  *gguf.Type // --output-tensor-type
	LeaveOutput bool       // --leave-output-tensor: output.weight is not quantized
	Pure        bool       // --pure: every quantized tensor gets the base type
}

// Choice is the type llama-quantize writes a tensor in.
type Choice struct {
	Name     string
	Type     gguf.Type
	Quantize bool // the tensor is one llama-quantize quantizes (else it is copied as it is)
	Fallback bool // the rules' type did not fit the rows, so llama.cpp's fallback was used
}

// Choose returns the type of each tensor, in the order given, as llama-quantize writes them
// under file type f.
func Choose(f FileType, m Model, tensors []Tensor, o Options) ([]Choice, error) {
	if _, ok := fileTypes[f]; !ok {
		return nil, fmt.Errorf("unknown llama.cpp file type %d", uint32(f))
	}
	s := &state{f: f, m: m, o: o}
	for _, t := range tensors {
		if containsAny(t.Name, "attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight") {
			s.nAttnV++
		} else if t.Name == "output.weight" {
			s.hasOutput = true
		}
	}
	out := make([]Choice, len(tensors))
	for _, i := range loaderOrder(tensors) {
		t := tensors[i]
		c := Choice{Name: t.Name, Type: t.Type, Quantize: quantizable(t, o)}
		if c.Quantize {
			var err error
			if c.Type, c.Fallback, err = s.choose(t); err != nil {
				return nil, err
			}
		}
		out[i] = c
	}
	return out, nil
}

// loaderOrder is the order llama-quantize visits tensors in (llama_model_loader's
// weight_name_comparer): by block number, tensors outside blocks first, then by name.
func loaderOrder(tensors []Tensor) []int {
	idx := make([]int, len(tensors))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		na, nb := tensors[idx[a]].Name, tensors[idx[b]].Name
		if la, lb := blockOf(na), blockOf(nb); la != lb {
			return la < lb
		}
		return na < nb
	})
	return idx
}

// blockOf is sscanf(name, "blk.%d.") with −1 when the name is not a block's.
func blockOf(name string) int {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return -1
	}
	end := strings.IndexByte(rest, '.')
	if end < 0 {
		return -1
	}
	n, err := strconv.Atoi(rest[:end])
	if err != nil {
		return -1
	}
	return n
}

// quantizable is llama_model_quantize_impl's filter: 2-D and 3-D weights other than norms,
// expert gates, position and token-type embeddings and a few architectures' small tensors.
func quantizable(t Tensor, o Options) bool {
	n := t.Name
	if !strings.HasSuffix(n, "weight") || nDims(t.Dims) < 2 || strings.Contains(n, "_norm.weight") {
		return false
	}
	if o.LeaveOutput && n == "output.weight" {
		return false
	}
	if n == "position_embd.weight" || n == "token_types.weight" {
		return false
	}
	return !containsAny(n, "ffn_gate_inp.weight", "ssm_conv1d.weight", "time_mix_first.weight", "time_mix_w1.weight",
		"time_mix_w2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
		"attn_rel_b.weight")
}

// nDims is ggml_n_dims: trailing dimensions of 1 do not count.
func nDims(dims []uint64) int {
	for i := len(dims) - 1; i >= 1; i-- {
		if dims[i] > 1 {
			return i + 1
		}
	}
	return 1
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// state holds llama-quantize's counters (quantize_state_impl), which advance as tensors are
// visited in loader order.
type state struct {
	f                          FileType
	m                          Model
	o                          Options
	hasOutput                  bool
	nAttnV, iAttnV             int
	iFFNDown, iFFNGate, iFFNUp int
}

// choose is the type of one quantized tensor: the base type, the per-tensor rules unless
// --pure, then the embedding and output overrides.
func (s *state) choose(t Tensor) (gguf.Type, bool, error) {
	typ := s.f.Base()
	fallback := false
	if !s.o.Pure && quantized(typ) {
		var err error
		if typ, fallback, err = s.tensorType(typ, t); err != nil {
			return 0, false, err
		}
	}
	if s.o.EmbedType != nil && t.Name == "token_embd.weight" {
		typ = *s.o.EmbedType
	}
	if s.o.OutputType != nil && t.Name == "output.weight" {
		typ = *s.o.OutputType
	}
	if bs := uint64(typ.BlockSize()); bs == 0 || t.Dims[0]%bs != 0 {
		return 0, false, fmt.Errorf("tensor %s: rows of %d values are not whole %s blocks", t.Name, t.Dims[0], typ)
	}
	return typ, fallback, nil
}

// useMoreBits picks the layers Q4_K_M and Q5_K_M give more bits: the first and last eighth
// and every third layer in between.
func useMoreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

// layerOf is llama.cpp's layer_info: the counter's value for dense models, the block number
// in the name for mixtures of experts (whose experts are not visited in layer order).
func (s *state) layerOf(counter int, name string) (int, error) {
	if max(1, s.m.Experts) == 1 {
		return counter, nil
	}
	i := blockOf(name)
	if i < 0 || i >= s.m.Layers {
		return 0, fmt.Errorf("tensor %s: cannot tell its layer (of %d)", name, s.m.Layers)
	}
	return i, nil
}

// tensorType is llama_tensor_get_type.
func (s *state) tensorType(typ gguf.Type, t Tensor) (gguf.Type, bool, error) {
	name, f := t.Name, s.f
	var err error
	switch {
	case name == "output.weight" || (!s.hasOutput && name == "token_embd.weight"):
		typ = s.outputType(typ, t)
	case name == "token_embd.weight":
		typ = s.embedType(typ)
	case f.is(IQ2_XXS, IQ2_XS, IQ1_S, IQ2_S, IQ2_M, IQ1_M):
		typ = s.veryLowBits(typ, name)
	case strings.Contains(name, "attn_v.weight"):
		typ = s.attnV(typ)
	case strings.Contains(name, "attn_k.weight"):
		switch {
		case s.m.Experts == 8:
			typ = gguf.Q8_0
		case f == IQ3_XS:
			typ = gguf.IQ3_XXS
		case f == IQ3_XXS:
			typ = gguf.IQ2_S
		}
	case strings.Contains(name, "attn_q.weight"):
		switch f {
		case IQ3_XS:
			typ = gguf.IQ3_XXS
		case IQ3_XXS:
			typ = gguf.IQ2_S
		}
	case strings.Contains(name, "ffn_down"):
		typ, err = s.ffnDown(typ, name)
	case strings.Contains(name, "attn_output.weight"):
		typ = s.attnOutput(typ)
	case strings.Contains(name, "attn_qkv.weight"):
		switch f {
		case MostlyQ3_KM, MostlyQ3_KL, IQ3_M:
			typ = gguf.Q4_K
		case MostlyQ4_KM:
			typ = gguf.Q5_K
		case MostlyQ5_KM:
			typ = gguf.Q6_K
		}
	case strings.Contains(name, "ffn_gate"):
		typ, err = s.ffnGateUp(typ, name, &s.iFFNGate)
	case strings.Contains(name, "ffn_up"):
		typ, err = s.ffnGateUp(typ, name, &s.iFFNUp)
	}
	if err != nil {
		return 0, false, err
	}
	return fallbackFor(typ, t)
}

func (f FileType) is(fs ...FileType) bool {
	for _, g := range fs {
		if f == g {
			return true
		}
	}
	return false
}

// outputType is the output tensor's type (and token_embd's when the embeddings are tied).
func (s *state) outputType(typ gguf.Type, t Tensor) gguf.Type {
	switch {
	case s.o.OutputType != nil:
		return *s.o.OutputType
	case s.m.Arch == "falcon" || t.Dims[0]%uint64(typ.BlockSize()) != 0:
		return gguf.Q8_0
	case s.f.is(IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ2_S, IQ2_M, IQ1_M):
		return gguf.Q5_K
	case typ != gguf.Q8_0:
		return gguf.Q6_K
	}
	return typ
}

func (s *state) embedType(typ gguf.Type) gguf.Type {
	switch {
	case s.o.EmbedType != nil:
		return *s.o.EmbedType
	case s.f.is(IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M):
		return gguf.Q2_K
	case s.f.is(IQ2_S, IQ2_M, IQ3_XXS):
		return gguf.IQ3_S
	case s.f.is(TQ1_0, TQ2_0):
		return gguf.Q4_K
	}
	return typ
}

// veryLowBits is the rule set of the 1- and 2-bit lattice file types.
func (s *state) veryLowBits(typ gguf.Type, name string) gguf.Type {
	f, m := s.f, s.m
	iq3sOrQ2K := gguf.Q2_K
	if f.is(IQ2_S, IQ2_M) {
		iq3sOrQ2K = gguf.IQ3_S
	}
	switch {
	case strings.Contains(name, "attn_v.weight"):
		typ = iq3sOrQ2K
		if m.gqa() >= 4 || m.Experts >= 4 {
			typ = gguf.Q4_K
		}
		s.iAttnV++
	case m.Experts == 8 && strings.Contains(name, "attn_k.weight"):
		typ = gguf.Q4_K
	case strings.Contains(name, "ffn_down"):
		if s.iFFNDown < m.Layers/8 {
			typ = iq3sOrQ2K
		}
		s.iFFNDown++
	case strings.Contains(name, "attn_output.weight"):
		switch {
		case m.Experts == 8:
			typ = gguf.Q5_K
		case f.is(IQ1_S, IQ1_M):
			typ = gguf.IQ2_XXS
		case f.is(IQ2_S, IQ2_M):
			typ = gguf.IQ3_S
		}
	}
	return typ
}

func (s *state) attnV(typ gguf.Type) gguf.Type {
	f, gqa := s.f, s.m.gqa()
	switch {
	case f == MostlyQ2_K:
		typ = gguf.Q3_K
		if gqa >= 4 {
			typ = gguf.Q4_K
		}
	case f == MostlyQ2_KS && gqa >= 4:
		typ = gguf.Q4_K
	case f == IQ3_XXS:
		switch {
		case gqa >= 4:
			typ = gguf.Q4_K
		case !s.o.Imatrix:
			typ = gguf.IQ3_S
		default:
			typ = gguf.IQ3_XXS
		}
	case f.is(IQ3_XS, IQ3_S) && gqa >= 4:
		typ = gguf.Q4_K
	case f == IQ3_M:
		typ = gguf.Q4_K
	case f == MostlyQ3_KM:
		typ = gguf.Q4_K
		if s.iAttnV < 2 {
			typ = gguf.Q5_K
		}
	case f == MostlyQ3_KL:
		typ = gguf.Q5_K
	case f.is(IQ4_NL, IQ4_XS) && gqa >= 4:
		typ = gguf.Q5_K
	case f.is(MostlyQ4_KM, MostlyQ5_KM) && useMoreBits(s.iAttnV, s.nAttnV):
		typ = gguf.Q6_K
	case f == MostlyQ4_KS && s.iAttnV < 4:
		typ = gguf.Q5_K
	}
	if s.m.Is70B && (typ == gguf.Q3_K || typ == gguf.Q4_K) {
		// 8 heads share each attn_v in the 70B model, so it is 8× smaller than attn_q.
		typ = gguf.Q5_K
	}
	if s.m.Experts == 8 {
		typ = gguf.Q8_0
	}
	s.iAttnV++
	return typ
}

func (s *state) ffnDown(typ gguf.Type, name string) (gguf.Type, error) {
	i, err := s.layerOf(s.iFFNDown, name)
	if err != nil {
		return 0, err
	}
	s.iFFNDown++
	f, n, falcon := s.f, s.m.Layers, s.m.Arch == "falcon"
	switch {
	case f == MostlyQ2_K:
		typ = gguf.Q3_K
	case f == MostlyQ2_KS:
		if i < n/8 {
			typ = gguf.Q4_K
		}
	case f == IQ3_XXS && !s.o.Imatrix:
		typ = gguf.Q3_K
		if i < n/8 {
			typ = gguf.Q4_K
		}
	case f == MostlyQ3_KM:
		switch {
		case i < n/16:
			typ = gguf.Q5_K
		case !falcon || useMoreBits(i, n):
			typ = gguf.Q4_K
		default:
			typ = gguf.Q3_K
		}
	case f == IQ3_M && (i < n/8 || (s.m.Experts == 8 && useMoreBits(i, n))):
		typ = gguf.Q4_K
	case f == MostlyQ3_KL:
		typ = gguf.Q5_K
		if falcon {
			typ = gguf.Q4_K
		}
	case f == MostlyQ4_KM:
		switch {
		case falcon && i < n/16:
			typ = gguf.Q6_K
		case falcon && useMoreBits(i, n):
			typ = gguf.Q5_K
		case !falcon && useMoreBits(i, n):
			typ = gguf.Q6_K
		}
	case i < n/8 && f.is(IQ4_NL, IQ4_XS) && !s.o.Imatrix:
		typ = gguf.Q5_K
	case f == MostlyQ5_KM && useMoreBits(i, n):
		typ = gguf.Q6_K
	case f == MostlyQ4_KS && !falcon && i < n/8:
		typ = gguf.Q5_K
	case f.is(MostlyQ4_0, MostlyQ5_0) && s.o.Imatrix && i < n/8:
		// llama.cpp guards the first ffn_down layers of Q4_0/Q5_0, only with an imatrix.
		typ = gguf.Q4_1
		if f == MostlyQ5_0 {
			typ = gguf.Q5_1
		}
	}
	return typ, nil
}

func (s *state) attnOutput(typ gguf.Type) gguf.Type {
	f := s.f
	if s.m.Arch == "falcon" {
		if f == MostlyQ3_KL {
			typ = gguf.Q4_K
		}
		return typ
	}
	if s.m.Experts == 8 {
		if f.is(MostlyQ2_K, IQ3_XS, IQ3_XXS, MostlyQ3_KS, MostlyQ3_KM, IQ4_NL, MostlyQ4_KS, MostlyQ4_KM, IQ3_S, IQ3_M, IQ4_XS) {
			typ = gguf.Q5_K
		}
		return typ
	}
	switch f {
	case MostlyQ2_K:
		typ = gguf.Q3_K
	case IQ3_XXS:
		typ = gguf.IQ3_S
	case MostlyQ3_KM, IQ3_M:
		typ = gguf.Q4_K
	case MostlyQ3_KL:
		typ = gguf.Q5_K
	}
	return typ
}

// ffnGateUp gives IQ3_XS's middle layers IQ3_XXS in ffn_gate and ffn_up.
func (s *state) ffnGateUp(typ gguf.Type, name string, counter *int) (gguf.Type, error) {
	i, err := s.layerOf(*counter, name)
	if err != nil {
		return 0, err
	}
	*counter++
	n := s.m.Layers
	if s.f == IQ3_XS && i >= n/8 && i < 7*n/8 {
		typ = gguf.IQ3_XXS
	}
	return typ, nil
}

// fallbackFor replaces a type whose blocks do not divide the rows with llama.cpp's fallback
// (Q4_0, IQ4_NL, Q5_0, Q5_1 or Q8_0), or F16 when that does not fit either.
func fallbackFor(typ gguf.Type, t Tensor) (gguf.Type, bool, error) {
	nx := t.Dims[0]
	if nx%uint64(typ.BlockSize()) == 0 {
		return typ, false, nil
	}
	switch typ {
	case gguf.TQ1_0, gguf.TQ2_0:
		typ = gguf.Q4_0
	case gguf.IQ2_XXS, gguf.IQ2_XS, gguf.IQ2_S, gguf.IQ3_XXS, gguf.IQ3_S, gguf.IQ1_S, gguf.IQ1_M,
		gguf.Q2_K, gguf.Q3_K, gguf.IQ4_XS:
		typ = gguf.IQ4_NL
	case gguf.Q4_K:
		typ = gguf.Q5_0
	case gguf.Q5_K:
		typ = gguf.Q5_1
	case gguf.Q6_K:
		typ = gguf.Q8_0
	default:
		return 0, false, fmt.Errorf("tensor %s: rows of %d values are not whole %s blocks, and llama.cpp has no fallback for %s", t.Name, nx, typ, typ)
	}
	if nx%uint64(typ.BlockSize()) != 0 {
		typ = gguf.F16
	}
	return typ, true, nil
}
