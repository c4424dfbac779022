package ggufexport

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/qpack-dev/qpack/ftype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/model"
)

// Layout is a checkpoint as llama.cpp lays it out in a GGUF file: its architecture, the
// metadata (hyperparameters and tokenizer) and one tensor per role, in convert_hf_to_gguf.py's
// order. Export and `convert --format gguf` both write through it.
type Layout struct {
	Src    string
	Arch   string // llama.cpp's architecture name
	Config *model.Config
	kvs    []gguf.KV // hyperparameters, then the tokenizer
	roles  []role
}

// Role is one tensor of the layout.
type Role struct {
	GGUF, HF string
	Linear   bool // a linear weight, which a plan may quantize
	Heads    int  // llama's q/k: rows are permuted in this many heads (0: rows as they are)
	Optional bool // biases: absent in most checkpoints
	// Experts, for a merged expert tensor ([Experts, N, K]: ffn_gate_exps …), lists the Hugging
	// Face weights it holds, expert by expert; HF is then empty.
	Experts []string
	F32     bool // stored as F32 whatever the plan: routers, as convert_hf_to_gguf.py writes them
	Flat    bool // a [1, K] weight stored as the vector [K] llama.cpp reads (ffn_gate_inp_shexp)
}

// Dims are the GGUF dims of the role's tensor given the PyTorch shape of one of its Hugging
// Face tensors (for a merged tensor, of one expert).
func (r Role) Dims(shape []int) []uint64 {
	switch {
	case r.Experts != nil:
		return dims(append([]int{len(r.Experts)}, shape...))
	case r.Flat && len(shape) == 2 && shape[0] == 1:
		return dims(shape[1:])
	}
	return dims(shape)
}

// NewLayout reads the checkpoint's config.json and tokenizer.json; tokenizerPre, when set,
// overrides the detected tokenizer.ggml.pre; has says whether the checkpoint holds a tensor (a
// mixture of experts' names depend on its layout, Mixtral's or Qwen's).
func NewLayout(src, tokenizerPre string, has func(name string) bool) (*Layout, error) {
	cfg, err := model.LoadConfig(src)
	if err != nil {
		return nil, err
	}
	arch, ok := archOf[cfg.ModelType]
	if !ok {
		return nil, fmt.Errorf("%s: model_type %q has no GGUF export (%s do)", src, cfg.ModelType, strings.Join(slices.Sorted(maps.Keys(archOf)), ", "))
	}
	extra, err := readExtraConfig(src)
	if err != nil {
		return nil, err
	}
	kvs, err := hyperparameters(arch, cfg, extra)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	tokKVs, err := tokenizerKVs(src, cfg.Vocab, extra, tokenizerPre)
	if err != nil {
		return nil, err
	}
	return &Layout{Src: src, Arch: arch, Config: cfg, kvs: append(kvs, tokKVs...), roles: roles(arch, cfg, has)}, nil
}

// Roles lists the layout's tensors in file order (rope_freqs, when the model has one, comes
// first and is not among them: see RopeFreqs).
func (l *Layout) Roles() []Role {
	out := make([]Role, len(l.roles))
	for i, r := range l.roles {
		out[i] = Role{GGUF: r.gguf, HF: r.hf, Linear: r.linear, Heads: r.heads, Optional: r.optional,
			Experts: r.experts, F32: r.f32, Flat: r.flat}
	}
	return out
}

// KVs is the file's metadata: general.* (name defaults to the checkpoint directory's name),
// the hyperparameters, the tokenizer, then extra.
func (l *Layout) KVs(name string, ft ftype.FileType, extra ...gguf.KV) []gguf.KV {
	if name == "" {
		name = filepath.Base(filepath.Clean(l.Src))
	}
	head := []gguf.KV{
		{Key: "general.architecture", Value: l.Arch},
		{Key: "general.name", Value: name},
		{Key: "general.file_type", Value: uint32(ft)},
		{Key: "general.quantization_version", Value: uint32(2)},
	}
	return append(append(head, l.kvs...), extra...)
}

// RopeFreqs is the computed rope_freqs tensor of Llama 3's rope scaling, when the model has it.
func (l *Layout) RopeFreqs() (gguf.Tensor, bool) {
	if l.Config.Rope.Type != "llama3" {
		return gguf.Tensor{}, false
	}
	f := ropeFactors(l.Config)
	return floatTensor("rope_freqs.weight", gguf.F32, f, []int{len(f)}), true
}

// FTypeModel is what llama-quantize's per-tensor rules read of the model.
func (l *Layout) FTypeModel() ftype.Model {
	c := l.Config
	return ftype.Model{Arch: l.Arch, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads, Experts: c.MoE.Experts,
		Is70B: ftype.Is70B(l.Arch, c.Layers, c.Heads, c.KVHeads, c.MoE.Experts)}
}

// Dims turns a PyTorch shape into GGUF dims, innermost first.
func Dims(shape []int) []uint64 { return dims(shape) }

// EncodeFloat writes float weights of the given PyTorch shape in ggml type typ (ggml's
// reference quantizers for block types: what llama-quantize does without an imatrix), rows
// permuted in heads when heads > 0.
func EncodeFloat(w io.Writer, typ gguf.Type, v []float32, shape []int, heads int) error {
	return writeFloatRows(w, typ, v, shape, heads)
}

// PermuteRows returns encoded rows of rowBytes each in llama's q/k order for heads heads (the
// rows themselves when heads is 0): a row of blocks encodes one weight row on its own, so
// moving whole rows is exact.
func PermuteRows(b []byte, rowBytes, heads int) []byte {
	if heads == 0 {
		return b
	}
	var buf bytes.Buffer
	buf.Grow(len(b))
	writeByteRows(&buf, b, rowBytes, heads)
	return buf.Bytes()
}

// TensorNames maps each Hugging Face tensor name of a model of architecture cfg to its
// llama.cpp name ("model.layers.0.self_attn.q_proj.weight" → "blk.0.attn_q.weight"); has
// says whether the checkpoint holds a tensor. Experts, which llama.cpp merges into one tensor
// per projection and block, have no name of their own and are left out.
func TensorNames(cfg *model.Config, has func(name string) bool) (map[string]string, error) {
	arch, ok := archOf[cfg.ModelType]
	if !ok {
		return nil, fmt.Errorf("model_type %q has no llama.cpp names here (%s do)", cfg.ModelType, strings.Join(slices.Sorted(maps.Keys(archOf)), ", "))
	}
	out := map[string]string{}
	for _, r := range roles(arch, cfg, has) {
		if r.hf != "" {
			out[r.hf] = r.gguf
		}
	}
	return out, nil
}
