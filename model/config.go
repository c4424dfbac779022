package model

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Config is the architecture of a decoder-only model, read from a Hugging Face config.json.
type Config struct {
	ModelType     string // "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"
	Architecture  string // e.g. "LlamaForCausalLM"; empty when config.json names none
	Hidden        int    // hidden_size
	Intermediate  int    // intermediate_size (MLP width; Mixtral: each expert's)
	Layers        int    // num_hidden_layers
	Heads         int    // num_attention_heads
	KVHeads       int    // num_key_value_heads (GQA); equals Heads when absent
	HeadDim       int    // head_dim; Hidden/Heads when absent
	Vocab         int    // vocab_size
	RMSNormEps    float64
	TieEmbeddings bool // tie_word_embeddings: lm_head shares embed_tokens
	QKNorm        bool // qwen3: RMSNorm over head_dim on q and k before rotary
	Rope          Rope
	// SlidingWindow[i] is the attention window of block i in tokens, 0 for full causal attention.
	SlidingWindow []int
	// MoE describes the mixture-of-experts MLPs; its Experts is 0 in a dense model.
	MoE MoEConfig
}

// MoEConfig is the mixture-of-experts part of a Config (Mixtral, Qwen2-MoE, Qwen3-MoE).
type MoEConfig struct {
	Experts      int  // num_local_experts (Mixtral) or num_experts (Qwen)
	TopK         int  // num_experts_per_tok: experts each token is routed to
	Intermediate int  // each expert's MLP width: moe_intermediate_size (Mixtral: intermediate_size)
	NormTopK     bool // the top-k routing weights are renormalized to sum to 1 (norm_topk_prob; Mixtral always)
	// SharedIntermediate is the width of the shared expert every token goes through, scaled by a
	// sigmoid gate (Qwen2-MoE's shared_expert_intermediate_size); 0 when there is none.
	SharedIntermediate int
	// Sparse[i] says whether block i has experts; the others have a dense MLP of Intermediate
	// (Qwen's decoder_sparse_step and mlp_only_layers).
	Sparse []bool
}

// SparseBlock reports whether block i's MLP is a mixture of experts.
func (c *Config) SparseBlock(i int) bool { return i >= 0 && i < len(c.MoE.Sparse) && c.MoE.Sparse[i] }

// IsMoE reports whether the model has mixture-of-experts blocks.
func (c *Config) IsMoE() bool { return c.MoE.Experts > 0 }

// Rope holds the rotary embedding parameters.
type Rope struct {
	Theta float64
	Type  string // "default", "linear" or "llama3"
	// Factor divides the frequencies ("linear") or the low ones ("llama3").
	Factor float64
	// Llama-3 frequency bands.
	LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositions          int
	// InvFreqBF16 rounds the frequencies to bfloat16, as transformers ends up doing when a BF16
	// checkpoint is loaded in bf16 and then upcast (its inv_freq buffer is cast with the
	// weights): that is how the reference logits and perplexities of BF16 test models were made.
	InvFreqBF16 bool
}

// supportedFamilies maps model_type to its CausalLM architecture name.
var supportedFamilies = map[string]string{
	"llama":   "LlamaForCausalLM",
	"mistral": "MistralForCausalLM",
	"qwen2":   "Qwen2ForCausalLM",
	"qwen3":   "Qwen3ForCausalLM",
	// Mixtures of experts (moe.go).
	"mixtral":   "MixtralForCausalLM",
	"qwen2_moe": "Qwen2MoeForCausalLM",
	"qwen3_moe": "Qwen3MoeForCausalLM",
}

func supportedList() string {
	var s []string
	for t, a := range supportedFamilies {
		s = append(s, t+" ("+a+")")
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}

// rawConfig mirrors the config.json keys qpack reads; pointers tell absent from zero.
type rawConfig struct {
	ModelType       string          `json:"model_type"`
	Architectures   []string        `json:"architectures"`
	Hidden          int             `json:"hidden_size"`
	Intermediate    int             `json:"intermediate_size"`
	Layers          int             `json:"num_hidden_layers"`
	Heads           int             `json:"num_attention_heads"`
	KVHeads         *int            `json:"num_key_value_heads"`
	HeadDim         *int            `json:"head_dim"`
	Vocab           int             `json:"vocab_size"`
	RMSNormEps      *float64        `json:"rms_norm_eps"`
	HiddenAct       *string         `json:"hidden_act"`
	Tie             *bool           `json:"tie_word_embeddings"`
	RopeTheta       *float64        `json:"rope_theta"`
	RopeScaling     json.RawMessage `json:"rope_scaling"`
	RopeParameters  json.RawMessage `json:"rope_parameters"`
	SlidingWindow   *int            `json:"sliding_window"`
	UseSliding      *bool           `json:"use_sliding_window"`
	MaxWindowLayers *int            `json:"max_window_layers"`
	LayerTypes      []string        `json:"layer_types"`

	NumExperts         *int  `json:"num_experts"`
	NumLocalExperts    *int  `json:"num_local_experts"`
	ExpertsPerToken    *int  `json:"num_experts_per_tok"`
	MoEIntermediate    *int  `json:"moe_intermediate_size"`
	NormTopK           *bool `json:"norm_topk_prob"`
	SharedIntermediate *int  `json:"shared_expert_intermediate_size"`
	SparseStep         *int  `json:"decoder_sparse_step"`
	MLPOnlyLayers      []int `json:"mlp_only_layers"`
}

type rawRope struct {
	Theta                *float64 `json:"rope_theta"`
	RopeType             string   `json:"rope_type"`
	Type                 string   `json:"type"` // older name of rope_type
	Factor               *float64 `json:"factor"`
	LowFreqFactor        *float64 `json:"low_freq_factor"`
	HighFreqFactor       *float64 `json:"high_freq_factor"`
	OriginalMaxPositions *int     `json:"original_max_position_embeddings"`
}

// LoadConfig reads config.json from a checkpoint directory (or the file itself).
func LoadConfig(path string) (*Config, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes the contents of a config.json.
func ParseConfig(data []byte) (*Config, error) {
	var r rawConfig
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c := &Config{ModelType: r.ModelType, Hidden: r.Hidden, Intermediate: r.Intermediate,
		Layers: r.Layers, Heads: r.Heads, Vocab: r.Vocab, RMSNormEps: 1e-6}
	if err := c.setFamily(&r); err != nil {
		return nil, err
	}
	if r.HiddenAct != nil && *r.HiddenAct != "silu" {
		return nil, fmt.Errorf("config: hidden_act %q is not supported (only silu)", *r.HiddenAct)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden_size", r.Hidden}, {"intermediate_size", r.Intermediate},
		{"num_hidden_layers", r.Layers}, {"num_attention_heads", r.Heads}, {"vocab_size", r.Vocab}} {
		if f.v <= 0 {
			return nil, fmt.Errorf("config: %s must be positive, got %d", f.name, f.v)
		}
	}
	c.KVHeads = c.Heads
	if r.KVHeads != nil {
		c.KVHeads = *r.KVHeads
	}
	if c.KVHeads <= 0 || c.Heads%c.KVHeads != 0 {
		return nil, fmt.Errorf("config: num_key_value_heads %d must divide num_attention_heads %d", c.KVHeads, c.Heads)
	}
	if r.HeadDim != nil {
		c.HeadDim = *r.HeadDim
	} else if c.Hidden%c.Heads == 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	if c.HeadDim <= 0 || c.HeadDim%2 != 0 {
		return nil, fmt.Errorf("config: head_dim %d must be positive and even", c.HeadDim)
	}
	if r.RMSNormEps != nil {
		c.RMSNormEps = *r.RMSNormEps
	}
	if r.Tie != nil {
		c.TieEmbeddings = *r.Tie
	}
	c.QKNorm = c.ModelType == "qwen3" || c.ModelType == "qwen3_moe"
	rope, err := parseRope(&r)
	if err != nil {
		return nil, err
	}
	c.Rope = rope
	c.SlidingWindow, err = slidingWindows(&r, c.Layers)
	if err != nil {
		return nil, err
	}
	if c.MoE, err = parseMoE(&r, c.Layers); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) setFamily(r *rawConfig) error {
	arch, ok := supportedFamilies[r.ModelType]
	if !ok {
		return fmt.Errorf("config: model_type %q is not supported; supported: %s", r.ModelType, supportedList())
	}
	if len(r.Architectures) > 0 {
		c.Architecture = r.Architectures[0]
		if c.Architecture != arch {
			return fmt.Errorf("config: architecture %q is not supported for model_type %q; supported: %s",
				c.Architecture, r.ModelType, supportedList())
		}
	}
	return nil
}

// parseRope reads transformers-5 rope_parameters, or the older top-level rope_theta with rope_scaling.
func parseRope(r *rawConfig) (Rope, error) {
	var rr rawRope
	src := "rope_parameters"
	raw := r.RopeParameters
	if isNull(raw) {
		src, raw = "rope_scaling", r.RopeScaling
	}
	if !isNull(raw) {
		if err := json.Unmarshal(raw, &rr); err != nil {
			return Rope{}, fmt.Errorf("config: %s: %w", src, err)
		}
	}
	rope := Rope{Theta: 10000, Type: "default", Factor: 1}
	if rr.Theta != nil {
		rope.Theta = *rr.Theta
	} else if r.RopeTheta != nil {
		rope.Theta = *r.RopeTheta
	}
	if rr.RopeType != "" {
		rope.Type = rr.RopeType
	} else if rr.Type != "" {
		rope.Type = rr.Type
	}
	if rr.Factor != nil {
		rope.Factor = *rr.Factor
	}
	switch rope.Type {
	case "default":
	case "linear":
		if rr.Factor == nil || rope.Factor <= 0 {
			return Rope{}, fmt.Errorf("config: %s: rope_type linear needs a positive factor", src)
		}
	case "llama3":
		if rr.Factor == nil || rr.LowFreqFactor == nil || rr.HighFreqFactor == nil || rr.OriginalMaxPositions == nil {
			return Rope{}, fmt.Errorf("config: %s: rope_type llama3 needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings", src)
		}
		rope.LowFreqFactor, rope.HighFreqFactor = *rr.LowFreqFactor, *rr.HighFreqFactor
		rope.OriginalMaxPositions = *rr.OriginalMaxPositions
		if rope.HighFreqFactor <= rope.LowFreqFactor || rope.LowFreqFactor <= 0 {
			return Rope{}, fmt.Errorf("config: %s: llama3 needs 0 < low_freq_factor < high_freq_factor", src)
		}
	default:
		return Rope{}, fmt.Errorf("config: %s: rope_type %q is not supported (default, linear, llama3)", src, rope.Type)
	}
	if rope.Theta <= 0 {
		return Rope{}, fmt.Errorf("config: rope_theta must be positive, got %g", rope.Theta)
	}
	return rope, nil
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// slidingWindows follows transformers: layer_types when given; otherwise Mistral windows every
// layer when sliding_window is set, Qwen2/3 only with use_sliding_window, from max_window_layers on.
func slidingWindows(r *rawConfig, layers int) ([]int, error) {
	w := make([]int, layers)
	window := 0
	if r.SlidingWindow != nil {
		window = *r.SlidingWindow
	}
	sliding := func(i int) bool { return false }
	switch {
	case len(r.LayerTypes) > 0:
		if len(r.LayerTypes) != layers {
			return nil, fmt.Errorf("config: layer_types has %d entries, num_hidden_layers is %d", len(r.LayerTypes), layers)
		}
		for i, t := range r.LayerTypes {
			if t != "full_attention" && t != "sliding_attention" {
				return nil, fmt.Errorf("config: layer_types[%d] = %q is not supported", i, t)
			}
		}
		sliding = func(i int) bool { return r.LayerTypes[i] == "sliding_attention" }
	case r.ModelType == "mistral" || r.ModelType == "mixtral":
		sliding = func(i int) bool { return window > 0 }
	case r.ModelType == "qwen2" || r.ModelType == "qwen3" || r.ModelType == "qwen2_moe" || r.ModelType == "qwen3_moe":
		if r.UseSliding != nil && *r.UseSliding {
			from := 0
			if r.MaxWindowLayers != nil {
				from = *r.MaxWindowLayers
			}
			sliding = func(i int) bool { return i >= from }
		}
	}
	for i := range w {
		if sliding(i) {
			if window <= 0 {
				return nil, fmt.Errorf("config: layer %d uses sliding attention but sliding_window is %d", i, window)
			}
			w[i] = window
		}
	}
	return w, nil
}
