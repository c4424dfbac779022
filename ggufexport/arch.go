package ggufexport

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/model"
)

// archOf maps a Hugging Face model_type to llama.cpp's architecture name. Mistral and Mixtral
// are written as llama, as convert_hf_to_gguf.py does; llama-architecture q/k rows are
// permuted. qwen3moe is newer than some llama.cpp builds (moe.md).
var archOf = map[string]string{"llama": "llama", "mistral": "llama", "qwen2": "qwen2",
	"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}

// extraConfig holds the config.json keys model.Config does not keep.
type extraConfig struct {
	MaxPositions int  `json:"max_position_embeddings"`
	BOS          *int `json:"bos_token_id"`
	EOS          any  `json:"eos_token_id"` // an id or a list of ids
	Pad          *int `json:"pad_token_id"`
}

func readExtraConfig(dir string) (extraConfig, error) {
	var e extraConfig
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return e, err
	}
	if err := json.Unmarshal(b, &e); err != nil {
		return e, fmt.Errorf("%s: %w", filepath.Join(dir, "config.json"), err)
	}
	return e, nil
}

// firstID reads a token id that config.json gives as a number or a list of numbers.
func firstID(v any) (int, bool) {
	switch x := v.(type) {
	case float64:
		return int(x), true
	case []any:
		if len(x) > 0 {
			return firstID(x[0])
		}
	}
	return 0, false
}

// hyperparameters are the <arch>.* KVs llama.cpp's loader reads (names from gguf-py's
// constants.py Keys.LLM / Keys.Attention / Keys.Rope; counts as u32 as gguf-py writes them).
func hyperparameters(arch string, c *model.Config, e extraConfig) ([]gguf.KV, error) {
	kv := func(k string, v any) gguf.KV { return gguf.KV{Key: arch + "." + k, Value: v} }
	kvs := []gguf.KV{
		kv("context_length", uint32(e.MaxPositions)),
		kv("embedding_length", uint32(c.Hidden)),
		kv("block_count", uint32(c.Layers)),
		kv("feed_forward_length", uint32(c.Intermediate)),
		kv("attention.head_count", uint32(c.Heads)),
		kv("attention.head_count_kv", uint32(c.KVHeads)),
		kv("rope.freq_base", float32(c.Rope.Theta)),
		kv("attention.layer_norm_rms_epsilon", float32(c.RMSNormEps)),
		kv("rope.dimension_count", uint32(c.HeadDim)),
		kv("vocab_size", uint32(c.Vocab)),
	}
	if c.HeadDim*c.Heads != c.Hidden {
		kvs = append(kvs, kv("attention.key_length", uint32(c.HeadDim)), kv("attention.value_length", uint32(c.HeadDim)))
	}
	switch c.Rope.Type {
	case "default", "":
	case "linear":
		kvs = append(kvs, kv("rope.scaling.type", "linear"), kv("rope.scaling.factor", float32(c.Rope.Factor)))
	case "llama3": // carried by the rope_freqs tensor (ropeFactors), as convert_hf_to_gguf.py does
		if arch != "llama" {
			return nil, fmt.Errorf("rope_type llama3 on architecture %s is not supported", arch)
		}
	default:
		return nil, fmt.Errorf("rope_type %q has no GGUF export here (default, linear and llama3 do)", c.Rope.Type)
	}
	for i, w := range c.SlidingWindow {
		if w != 0 {
			return nil, fmt.Errorf("block %d uses sliding-window attention (%d tokens), which the %s GGUF architecture does not carry", i, w, arch)
		}
	}
	if c.QKNorm && arch != "qwen3moe" {
		return nil, fmt.Errorf("q/k norms (qwen3) are not exported")
	}
	if c.IsMoE() {
		moe, err := moeHyperparameters(arch, c)
		if err != nil {
			return nil, err
		}
		kvs = append(kvs, moe...)
	}
	return kvs, nil
}

// moeHyperparameters are the experts' KVs (llama.cpp LLM_KV_EXPERT_*), after checking that the
// architecture computes the model's routing: llama (Mixtral) and qwen3moe renormalize the top-k
// weights, qwen2moe does not, and all three have experts in every block.
func moeHyperparameters(arch string, c *model.Config) ([]gguf.KV, error) {
	kv := func(k string, v any) gguf.KV { return gguf.KV{Key: arch + "." + k, Value: v} }
	m := c.MoE
	for i := range c.Layers {
		if !c.SparseBlock(i) {
			return nil, fmt.Errorf("block %d has a dense MLP (mlp_only_layers, decoder_sparse_step): llama.cpp's %s has experts in every block", i, arch)
		}
	}
	if norm := arch != "qwen2moe"; m.NormTopK != norm {
		return nil, fmt.Errorf("norm_topk_prob is %v, but llama.cpp's %s always computes it as %v", m.NormTopK, arch, norm)
	}
	if m.SharedIntermediate > 0 && arch != "qwen2moe" {
		return nil, fmt.Errorf("a shared expert has no tensors in llama.cpp's %s", arch)
	}
	kvs := []gguf.KV{kv("expert_count", uint32(m.Experts)), kv("expert_used_count", uint32(m.TopK))}
	if arch != "llama" { // llama's experts are feed_forward_length wide
		kvs = append(kvs, kv("expert_feed_forward_length", uint32(m.Intermediate)))
	}
	if m.SharedIntermediate > 0 {
		kvs = append(kvs, kv("expert_shared_feed_forward_length", uint32(m.SharedIntermediate)))
	}
	return kvs, nil
}

// ropeFactors are Llama 3's per-frequency divisors, the rope_freqs.weight tensor
// (convert_hf_to_gguf.py LlamaModel.generate_extra_tensors): 1 for short wavelengths,
// factor for long ones, a smooth blend in between.
func ropeFactors(c *model.Config) []float32 {
	r := c.Rope
	low := float64(r.OriginalMaxPositions) / r.LowFreqFactor
	high := float64(r.OriginalMaxPositions) / r.HighFreqFactor
	out := make([]float32, c.HeadDim/2)
	for i := range out {
		freq := 1 / math.Pow(r.Theta, float64(2*i)/float64(c.HeadDim))
		wavelen := 2 * math.Pi / freq
		switch {
		case wavelen < high:
			out[i] = 1
		case wavelen > low:
			out[i] = float32(r.Factor)
		default:
			smooth := (float64(r.OriginalMaxPositions)/wavelen - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
			out[i] = float32(1 / ((1-smooth)/r.Factor + smooth))
		}
	}
	return out
}

// role is one tensor of the model: its GGUF and Hugging Face names, whether it is a linear
// weight (quantizable), and for llama q/k the number of heads whose rows are permuted.
type role struct {
	gguf, hf string
	linear   bool
	heads    int
	optional bool
	// experts, for a merged expert tensor (ffn_gate_exps …, [Experts, N, K]), lists the Hugging
	// Face weights it holds, expert by expert; hf is then empty.
	experts []string
	f32     bool // stored as F32 whatever the options: routers, as convert_hf_to_gguf.py writes them
	flat    bool // a [1, K] weight stored as the vector [K] llama.cpp reads (ffn_gate_inp_shexp)
}

// roles lists the model's tensors in the order convert_hf_to_gguf.py writes them; has says
// whether the checkpoint holds a tensor (the experts' names depend on its layout).
func roles(arch string, c *model.Config, has func(name string) bool) []role {
	permute := arch == "llama"
	qh, kh := 0, 0
	if permute {
		qh, kh = c.Heads, c.KVHeads
	}
	rs := []role{{gguf: "token_embd.weight", hf: "model.embed_tokens.weight"}}
	for i := range c.Layers {
		b, p := fmt.Sprintf("blk.%d.", i), fmt.Sprintf("model.layers.%d.", i)
		rs = append(rs,
			role{gguf: b + "attn_norm.weight", hf: p + "input_layernorm.weight"},
			role{gguf: b + "attn_q.weight", hf: p + "self_attn.q_proj.weight", linear: true, heads: qh},
			role{gguf: b + "attn_q.bias", hf: p + "self_attn.q_proj.bias", heads: qh, optional: true},
			role{gguf: b + "attn_k.weight", hf: p + "self_attn.k_proj.weight", linear: true, heads: kh},
			role{gguf: b + "attn_k.bias", hf: p + "self_attn.k_proj.bias", heads: kh, optional: true},
			role{gguf: b + "attn_v.weight", hf: p + "self_attn.v_proj.weight", linear: true},
			role{gguf: b + "attn_v.bias", hf: p + "self_attn.v_proj.bias", optional: true},
			role{gguf: b + "attn_output.weight", hf: p + "self_attn.o_proj.weight", linear: true},
		)
		if c.QKNorm {
			rs = append(rs, role{gguf: b + "attn_q_norm.weight", hf: p + "self_attn.q_norm.weight"},
				role{gguf: b + "attn_k_norm.weight", hf: p + "self_attn.k_norm.weight"})
		}
		rs = append(rs, role{gguf: b + "ffn_norm.weight", hf: p + "post_attention_layernorm.weight"})
		if c.SparseBlock(i) {
			rs = append(rs, expertRoles(b, c.MoENames(i, has))...)
			continue
		}
		rs = append(rs,
			role{gguf: b + "ffn_gate.weight", hf: p + "mlp.gate_proj.weight", linear: true},
			role{gguf: b + "ffn_up.weight", hf: p + "mlp.up_proj.weight", linear: true},
			role{gguf: b + "ffn_down.weight", hf: p + "mlp.down_proj.weight", linear: true},
		)
	}
	rs = append(rs, role{gguf: "output_norm.weight", hf: "model.norm.weight"})
	switch {
	case !c.TieEmbeddings:
		rs = append(rs, role{gguf: "output.weight", hf: "lm_head.weight"})
	case arch == "qwen2moe": // its loader requires output (no fallback to token_embd)
		rs = append(rs, role{gguf: "output.weight", hf: "model.embed_tokens.weight"})
	}
	return rs
}

// expertRoles are a sparse block's tensors (gguf-py's MODEL_TENSOR.FFN_*_EXP[S], *_SHEXP): the
// router, the experts merged per projection, and a shared expert with its gate.
func expertRoles(b string, n model.ExpertNames) []role {
	weights := func(modules []string) []string {
		w := make([]string, len(modules))
		for i, m := range modules {
			w[i] = m + ".weight"
		}
		return w
	}
	rs := []role{{gguf: b + "ffn_gate_inp.weight", hf: n.Router + ".weight", f32: true},
		{gguf: b + "ffn_gate_exps.weight", linear: true, experts: weights(n.Gate)},
		{gguf: b + "ffn_down_exps.weight", linear: true, experts: weights(n.Down)},
		{gguf: b + "ffn_up_exps.weight", linear: true, experts: weights(n.Up)},
	}
	if n.SharedGate != "" {
		rs = append(rs, role{gguf: b + "ffn_gate_inp_shexp.weight", hf: n.SharedGate + ".weight", f32: true, flat: true},
			role{gguf: b + "ffn_gate_shexp.weight", hf: n.Shared[0] + ".weight", linear: true},
			role{gguf: b + "ffn_down_shexp.weight", hf: n.Shared[2] + ".weight", linear: true},
			role{gguf: b + "ffn_up_shexp.weight", hf: n.Shared[1] + ".weight", linear: true})
	}
	return rs
}

// permuteRows returns the source row of each output row for llama's q/k permutation
// (convert_hf_to_gguf.py LlamaModel.permute): rows viewed as [heads, 2, head_dim/2] have
// their two inner axes swapped, turning Hugging Face's rotate-half layout into the
// interleaved pairs llama.cpp rotates. Output row h·hd + 2i + j takes row h·hd + j·hd/2 + i.
func permuteRows(rows, heads int) []int {
	hd := rows / heads
	src := make([]int, rows)
	for h := range heads {
		for i := range hd / 2 {
			for j := range 2 {
				src[h*hd+2*i+j] = h*hd + j*hd/2 + i
			}
		}
	}
	return src
}
