package model

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestLoadConfigTiny(t *testing.T) {
	c, err := LoadConfig(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{ModelType: "llama", Architecture: "LlamaForCausalLM", Hidden: 128, Intermediate: 384,
		Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 32, Vocab: 2048, RMSNormEps: 1e-5,
		Rope: Rope{Theta: 10000, Type: "default", Factor: 1}, SlidingWindow: []int{0, 0, 0, 0}}
	if c.Rope != want.Rope || !slices.Equal(c.SlidingWindow, want.SlidingWindow) {
		t.Errorf("rope/window %+v %v, want %+v %v", c.Rope, c.SlidingWindow, want.Rope, want.SlidingWindow)
	}
	c.SlidingWindow, want.SlidingWindow = nil, nil
	if !reflect.DeepEqual(*c, want) {
		t.Errorf("config\n got %+v\nwant %+v", *c, want)
	}
}

func TestParseConfigFamilies(t *testing.T) {
	base := `"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 50`
	cases := []struct {
		json  string
		check func(c *Config) bool
	}{
		{`{"model_type": "llama", ` + base + `, "rope_theta": 500000}`, func(c *Config) bool {
			return c.Rope.Theta == 500000 && c.KVHeads == 4 && c.HeadDim == 16 && !c.TieEmbeddings
		}},
		{`{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], ` + base + `, "tie_word_embeddings": true,
		  "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 2, "num_key_value_heads": 2}`,
			func(c *Config) bool {
				return c.TieEmbeddings && c.KVHeads == 2 && slices.Equal(c.SlidingWindow, []int{0, 0, 8})
			}},
		{`{"model_type": "qwen3", ` + base + `, "head_dim": 32, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}}`,
			func(c *Config) bool { return c.QKNorm && c.HeadDim == 32 && c.Rope.Theta == 1e6 }},
		{`{"model_type": "mistral", ` + base + `, "sliding_window": 4096}`,
			func(c *Config) bool { return slices.Equal(c.SlidingWindow, []int{4096, 4096, 4096}) }},
		{`{"model_type": "mistral", ` + base + `, "sliding_window": null}`,
			func(c *Config) bool { return slices.Equal(c.SlidingWindow, []int{0, 0, 0}) }},
		{`{"model_type": "llama", ` + base + `, "rope_theta": 500000, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
		  "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}`,
			func(c *Config) bool {
				return c.Rope == Rope{Theta: 500000, Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositions: 8192}
			}},
		{`{"model_type": "llama", ` + base + `, "rope_scaling": {"type": "linear", "factor": 2}}`,
			func(c *Config) bool { return c.Rope.Type == "linear" && c.Rope.Factor == 2 }},
	}
	for _, tc := range cases {
		c, err := ParseConfig([]byte(tc.json))
		if err != nil {
			t.Errorf("%s: %v", tc.json, err)
			continue
		}
		if !tc.check(c) {
			t.Errorf("%s: unexpected config %+v", tc.json, *c)
		}
	}
}

func TestParseConfigErrors(t *testing.T) {
	base := `"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 50`
	cases := map[string]string{
		`{"model_type": "gpt2", ` + base + `}`:                                                        "supported: llama (LlamaForCausalLM), mistral",
		`{"model_type": "llama", "architectures": ["LlamaForSequenceClassification"], ` + base + `}`:  "LlamaForSequenceClassification",
		`{"model_type": "llama", ` + base + `, "num_key_value_heads": 3}`:                             "num_key_value_heads",
		`{"model_type": "llama", ` + base + `, "hidden_act": "gelu"}`:                                 "hidden_act",
		`{"model_type": "llama", ` + base + `, "rope_scaling": {"rope_type": "yarn", "factor": 4}}`:   "yarn",
		`{"model_type": "llama", ` + base + `, "rope_scaling": {"rope_type": "llama3", "factor": 8}}`: "low_freq_factor",
		`{"model_type": "llama", "hidden_size": 0}`:                                                   "hidden_size",
		`{"model_type": "qwen2", ` + base + `, "layer_types": ["full_attention"]}`:                    "layer_types",
		`not json`: "config",
	}
	for in, want := range cases {
		_, err := ParseConfig([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one mentioning %q", in, err, want)
		}
	}
}

// TestLlama3Frequencies checks the three bands of Llama 3.1's rotary scaling against the
// formula evaluated in float64.
func TestLlama3Frequencies(t *testing.T) {
	cfg := &Config{HeadDim: 128, Rope: Rope{Theta: 500000, Type: "llama3", Factor: 8, LowFreqFactor: 1,
		HighFreqFactor: 4, OriginalMaxPositions: 8192}}
	got := newRopeTable(cfg).invFreq
	bands := map[string]int{}
	for i, f := range got {
		base := math.Pow(500000, -float64(2*i)/128)
		wavelen := 2 * math.Pi / base
		want, band := base, "high"
		switch {
		case wavelen > 8192:
			want, band = base/8, "low"
		case wavelen >= 2048:
			s := (8192/wavelen - 1) / 3
			want, band = (1-s)*base/8+s*base, "medium"
		}
		bands[band]++
		if math.Abs(float64(f)-want) > 1e-6*want {
			t.Errorf("inv_freq[%d] (%s band) = %g, want %g", i, band, f, want)
		}
	}
	if len(bands) != 3 {
		t.Errorf("bands covered: %v, want all three", bands)
	}
}

// syntheticWeights makes random weights for every tensor cfg needs; bias adds q/k/v biases.
func syntheticWeights(cfg *Config, bias, lmHead bool) *MapWeights {
	return randomWeights(cfg, bias, lmHead, rand.New(rand.NewPCG(1, 2)))
}

// randomWeights is syntheticWeights drawn from r.
func randomWeights(cfg *Config, bias, lmHead bool, r *rand.Rand) *MapWeights {
	w := NewMapWeights()
	set := func(name string, shape ...int) {
		d := make([]float32, product(shape))
		for i := range d {
			d[i] = float32(r.NormFloat64() * 0.1)
			if len(shape) == 1 && strings.HasSuffix(name, "norm.weight") {
				d[i] += 1
			}
		}
		w.Set(name, d, shape...)
	}
	h, q, kv := cfg.Hidden, cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim
	set("model.embed_tokens.weight", cfg.Vocab, h)
	set("model.norm.weight", h)
	if lmHead {
		set("lm_head.weight", cfg.Vocab, h)
	}
	for i := range cfg.Layers {
		p := "model.layers." + strconv.Itoa(i) + "."
		set(p+"input_layernorm.weight", h)
		set(p+"post_attention_layernorm.weight", h)
		set(p+"self_attn.q_proj.weight", q, h)
		set(p+"self_attn.k_proj.weight", kv, h)
		set(p+"self_attn.v_proj.weight", kv, h)
		set(p+"self_attn.o_proj.weight", h, q)
		if cfg.SparseBlock(i) {
			randomExperts(cfg, i, set)
		} else {
			set(p+"mlp.gate_proj.weight", cfg.Intermediate, h)
			set(p+"mlp.up_proj.weight", cfg.Intermediate, h)
			set(p+"mlp.down_proj.weight", h, cfg.Intermediate)
		}
		if bias {
			set(p+"self_attn.q_proj.bias", q)
			set(p+"self_attn.k_proj.bias", kv)
			set(p+"self_attn.v_proj.bias", kv)
		}
		if cfg.QKNorm {
			set(p+"self_attn.q_norm.weight", cfg.HeadDim)
			set(p+"self_attn.k_norm.weight", cfg.HeadDim)
		}
	}
	return w
}

func mustConfig(t testing.TB, js string) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// logitsAfter returns the logits of a fresh model over w after edit has changed one tensor.
func logitsAfter(t *testing.T, cfg *Config, w *MapWeights, edit func()) []float32 {
	t.Helper()
	if edit != nil {
		edit()
	}
	m, err := Load(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	out, err := m.Logits([]int{3, 1, 4, 1, 5, 9, 2, 6})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("logit %d is %v", i, v)
		}
	}
	return out
}

func TestQwen2BiasAndTiedEmbeddings(t *testing.T) {
	cfg := mustConfig(t, `{"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 16, "tie_word_embeddings": true}`)
	w := syntheticWeights(cfg, true, false)
	m, err := Load(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	if &m.LMHead.W[0] != &m.Embed[0] {
		t.Error("tied lm_head does not share embed_tokens")
	}
	b, _ := m.Block(1)
	if b.Q.Bias == nil || b.K.Bias == nil || b.V.Bias == nil || b.O.Bias != nil {
		t.Error("qwen2 biases not loaded as q/k/v only")
	}
	before := logitsAfter(t, cfg, w, nil)
	after := logitsAfter(t, cfg, w, func() { w.Data["model.layers.1.self_attn.v_proj.bias"][0] += 1 })
	if slices.Equal(before, after) {
		t.Error("changing a v_proj bias did not change the logits")
	}
	cfg.TieEmbeddings = false
	if _, err := Load(cfg, w); err == nil || !strings.Contains(err.Error(), `"lm_head.weight" not found`) {
		t.Errorf("untied model without lm_head: error %v", err)
	}
}

func TestQwen3QKNorm(t *testing.T) {
	cfg := mustConfig(t, `{"model_type": "qwen3", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 16}`)
	w := syntheticWeights(cfg, false, true)
	before := logitsAfter(t, cfg, w, nil)
	after := logitsAfter(t, cfg, w, func() { w.Data["model.layers.0.self_attn.k_norm.weight"][3] *= 2 })
	if slices.Equal(before, after) {
		t.Error("changing k_norm did not change the logits")
	}
	delete(w.Shapes, "model.layers.1.self_attn.q_norm.weight")
	m, err := Load(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Logits([]int{1, 2}); err == nil || !strings.Contains(err.Error(), "model.layers.1.self_attn.q_norm.weight") {
		t.Errorf("missing q_norm: error %v", err)
	}
}

func TestLoadRejectsBadTensors(t *testing.T) {
	cfg := mustConfig(t, `{"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
		"num_attention_heads": 4, "vocab_size": 16}`)
	w := syntheticWeights(cfg, false, true)
	w.Shapes["model.layers.0.mlp.up_proj.weight"] = []int{32, 48}
	w.Data["model.norm.weight"][5] = float32(math.NaN())
	if _, err := Load(cfg, w); err == nil || !strings.Contains(err.Error(), "model.norm.weight") {
		t.Errorf("NaN in model.norm.weight: error %v", err)
	}
	w.Data["model.norm.weight"][5] = 1
	m, err := Load(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Logits([]int{1}); err == nil || !strings.Contains(err.Error(), "up_proj.weight\" has shape [32 48], want [48 32]") {
		t.Errorf("transposed up_proj: error %v", err)
	}
	if _, err := m.Logits([]int{16}); err == nil || !strings.Contains(err.Error(), "vocabulary") {
		t.Errorf("token id 16 of vocabulary 16: error %v", err)
	}
}

// TestSlidingWindowAttention: a window covering the sequence is full causal attention, a window
// of one token makes every position attend only to itself (output = its own value).
func TestSlidingWindowAttention(t *testing.T) {
	const T, heads, kvHeads, d = 6, 2, 1, 4
	r := rand.New(rand.NewPCG(3, 4))
	rnd := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	q, k, v := rnd(T*heads*d), rnd(T*kvHeads*d), rnd(T*kvHeads*d)
	full, wide, one := make([]float32, T*heads*d), make([]float32, T*heads*d), make([]float32, T*heads*d)
	attention(full, q, k, v, T, heads, kvHeads, d, 0)
	attention(wide, q, k, v, T, heads, kvHeads, d, T)
	attention(one, q, k, v, T, heads, kvHeads, d, 1)
	if !slices.Equal(full, wide) {
		t.Error("window ≥ T differs from full causal attention")
	}
	for tok := range T {
		for h := range heads {
			got := one[(tok*heads+h)*d : (tok*heads+h+1)*d]
			if want := v[tok*d : (tok+1)*d]; !slices.Equal(got, want) {
				t.Errorf("window 1, token %d head %d: %v, want %v", tok, h, got, want)
			}
		}
	}
}
