package ggufexport

import (
	"fmt"
	"strings"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/model"
)

// IsGGUF reports whether path names a GGUF file (by its extension, as llama.cpp's tools do).
func IsGGUF(path string) bool { return strings.HasSuffix(strings.ToLower(path), ".gguf") }

// modelTypeOf maps llama.cpp's architecture names back to a Hugging Face model_type.
// llama with experts is Mixtral (readMoE).
var modelTypeOf = map[string]string{"llama": "llama", "qwen2": "qwen2", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}

// OpenModel opens a GGUF file of a llama, qwen2 or mixture-of-experts (Mixtral as llama,
// qwen2moe, qwen3moe) model — written by qpack or by llama.cpp's tools — as a model whose weights are decoded to float32 block by block as they are used.
func OpenModel(path string) (*model.Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	cfg, err := ConfigOf(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	w := newWeights(f, cfg)
	m, err := model.Load(cfg, w)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// kvReader reads the <arch>.* hyperparameters, keeping the first error.
type kvReader struct {
	f    *gguf.File
	arch string
	err  error
}

// uint reads an integer KV of any width; absent gives def (or an error when def < 0).
func (r *kvReader) uint(key string, def int) int {
	v, ok := r.f.Get(r.arch + "." + key)
	if !ok {
		if def < 0 && r.err == nil {
			r.err = fmt.Errorf("no %s.%s", r.arch, key)
		}
		return def
	}
	switch x := v.(type) {
	case uint8:
		return int(x)
	case uint16:
		return int(x)
	case uint32:
		return int(x)
	case uint64:
		return int(x)
	case int32:
		return int(x)
	case int64:
		return int(x)
	}
	if r.err == nil {
		r.err = fmt.Errorf("%s.%s is a %T, not one integer (per-layer values are not read)", r.arch, key, v)
	}
	return def
}

func (r *kvReader) float(key string, def float64) float64 {
	v, ok := r.f.Get(r.arch + "." + key)
	if !ok {
		return def
	}
	switch x := v.(type) {
	case float32:
		return float64(x)
	case float64:
		return x
	}
	if r.err == nil {
		r.err = fmt.Errorf("%s.%s is a %T, not a float", r.arch, key, v)
	}
	return def
}

// ConfigOf reads a model's architecture from a GGUF file's metadata, as llama.cpp's loader
// does: the <arch>.* hyperparameters, the vocabulary size from the embedding, and tied
// embeddings when there is no output tensor.
func ConfigOf(f *gguf.File) (*model.Config, error) {
	v, _ := f.Get("general.architecture")
	arch, _ := v.(string)
	mt, ok := modelTypeOf[arch]
	if !ok {
		return nil, fmt.Errorf("general.architecture %q: qpack reads llama, qwen2, qwen2moe and qwen3moe GGUF files", arch)
	}
	r := &kvReader{f: f, arch: arch}
	c := &model.Config{ModelType: mt}
	c.Hidden = r.uint("embedding_length", -1)
	c.Layers = r.uint("block_count", -1)
	c.Intermediate = r.uint("feed_forward_length", -1)
	c.Heads = r.uint("attention.head_count", -1)
	c.KVHeads = r.uint("attention.head_count_kv", c.Heads)
	c.RMSNormEps = r.float("attention.layer_norm_rms_epsilon", 1e-5)
	c.Rope = model.Rope{Theta: r.float("rope.freq_base", 10000), Type: "default", Factor: 1}
	if c.Heads > 0 {
		c.HeadDim = r.uint("attention.key_length", c.Hidden/c.Heads)
	}
	if rot := r.uint("rope.dimension_count", c.HeadDim); r.err == nil && rot != c.HeadDim {
		r.err = fmt.Errorf("rope over %d of %d head dimensions (partial rotary) is not supported", rot, c.HeadDim)
	}
	if st, ok := f.Get(arch + ".rope.scaling.type"); ok && st != "none" {
		if st != "linear" {
			return nil, fmt.Errorf("%s.rope.scaling.type %v is not supported (linear is)", arch, st)
		}
		c.Rope.Type = "linear"
		if c.Rope.Factor = r.float("rope.scaling.factor", 0); c.Rope.Factor <= 0 && r.err == nil {
			r.err = fmt.Errorf("%s.rope.scaling.factor must be positive", arch)
		}
	}
	readMoE(r, c)
	c.Architecture = hfArchitecture[c.ModelType]
	if r.err != nil {
		return nil, r.err
	}
	if _, ok := f.Tensor("rope_freqs.weight"); ok {
		return nil, fmt.Errorf("rope_freqs.weight (Llama 3 rope scaling as per-frequency factors) is not read yet")
	}
	embd, ok := f.Tensor("token_embd.weight")
	if !ok || len(embd.Dims) != 2 {
		return nil, fmt.Errorf("no 2-D token_embd.weight tensor")
	}
	c.Vocab = int(embd.Dims[1])
	_, hasOutput := f.Tensor("output.weight")
	c.TieEmbeddings = !hasOutput
	c.SlidingWindow = make([]int, c.Layers)
	if c.Hidden <= 0 || c.Layers <= 0 || c.Intermediate <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.Heads%c.KVHeads != 0 ||
		c.HeadDim <= 0 || c.HeadDim%2 != 0 {
		return nil, fmt.Errorf("inconsistent hyperparameters: hidden %d, layers %d, ffn %d, heads %d/%d, head_dim %d",
			c.Hidden, c.Layers, c.Intermediate, c.Heads, c.KVHeads, c.HeadDim)
	}
	return c, nil
}

// hfArchitecture is the CausalLM class of each model_type ConfigOf gives.
var hfArchitecture = map[string]string{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM",
	"qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}

// readMoE reads a mixture of experts' KVs, those moeHyperparameters writes: llama with experts
// is Mixtral; llama and qwen3moe renormalize the top-k weights, qwen2moe does not; every block
// is sparse.
func readMoE(r *kvReader, c *model.Config) {
	experts := r.uint("expert_count", 0)
	if experts == 0 {
		if c.ModelType != "llama" && c.ModelType != "qwen2" {
			r.uint("expert_count", -1) // a mixture of experts' architecture without experts
		}
		return
	}
	if c.ModelType == "llama" {
		c.ModelType = "mixtral"
	}
	c.QKNorm = c.ModelType == "qwen3_moe"
	c.MoE = model.MoEConfig{Experts: experts, TopK: r.uint("expert_used_count", -1),
		Intermediate: r.uint("expert_feed_forward_length", c.Intermediate), NormTopK: r.arch != "qwen2moe",
		SharedIntermediate: r.uint("expert_shared_feed_forward_length", 0), Sparse: make([]bool, c.Layers)}
	for i := range c.MoE.Sparse {
		c.MoE.Sparse[i] = true
	}
}
