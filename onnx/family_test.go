package onnx

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/internal/synth"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// familyVariant writes the tiny model's weights as another family: config keys changed, and the
// tensors that family adds (qkv biases, q/k norms) random; tied drops lm_head.
func familyVariant(t *testing.T, config map[string]any, biases, qkNorms, tied bool) string {
	t.Helper()
	src := tinyDir(t)
	ck, err := safetensors.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	r := rand.New(rand.NewPCG(1, 2))
	f32 := func(name string, v []float32, shape ...int) safetensors.WriterTensor {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return safetensors.BytesTensor(name, safetensors.F32, shape, b)
	}
	random := func(n int, mean, std float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(mean + std*r.NormFloat64())
		}
		return v
	}
	var ts []safetensors.WriterTensor
	for _, name := range ck.Names() {
		if tied && name == "lm_head.weight" {
			continue
		}
		v, err := ck.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		shape, _ := ck.Shape(name)
		ts = append(ts, f32(name, v, shape...))
		prefix, isProj := strings.CutSuffix(name, "_proj.weight")
		if !isProj || !strings.Contains(name, "self_attn.") || strings.HasSuffix(prefix, ".o") {
			continue
		}
		if biases {
			ts = append(ts, f32(prefix+"_proj.bias", random(shape[0], 0, 0.5), shape[0]))
		}
		if qkNorms && !strings.HasSuffix(prefix, ".v") {
			ts = append(ts, f32(prefix+"_norm.weight", random(32, 1, 0.3), 32))
		}
	}
	var cfg map[string]any
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	for k, v := range config {
		cfg[k] = v
	}
	cfg["tie_word_embeddings"] = tied
	dir := t.TempDir()
	if b, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestExportFamilies checks each family's graph features (qkv bias and tied embeddings for
// qwen2, q/k norms for qwen3, sliding window for mistral, Llama-3 rope scaling), plain and
// quantized, against qpack's forward pass, with the KV cache.
func TestExportFamilies(t *testing.T) {
	ids := heldout(t, tinyDir(t), 64)
	cases := []struct {
		name                  string
		config                map[string]any
		biases, qkNorms, tied bool
	}{
		{"qwen2", map[string]any{"model_type": "qwen2", "architectures": []string{"Qwen2ForCausalLM"},
			"rope_parameters": map[string]any{"rope_theta": 1e6, "rope_type": "default"}}, true, false, true},
		{"qwen3", map[string]any{"model_type": "qwen3", "architectures": []string{"Qwen3ForCausalLM"}}, false, true, false},
		{"mistral", map[string]any{"model_type": "mistral", "architectures": []string{"MistralForCausalLM"}, "sliding_window": 16}, false, false, false},
		{"llama3-rope", map[string]any{"rope_parameters": map[string]any{"rope_theta": 500000.0, "rope_type": "llama3",
			"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}, false, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := familyVariant(t, c.config, c.biases, c.qkNorms, c.tied)
			checkExport(t, src, ids, Options{})
			opt := convert.DefaultOptions()
			opt.Alloc = convert.Uniform(quant.Scheme{Bits: 4, GroupSize: 32})
			opt.InputHash = convert.HashNone
			q := filepath.Join(t.TempDir(), "q")
			if _, err := convert.Convert(src, q, opt); err != nil {
				t.Fatal(err)
			}
			checkExport(t, q, ids, Options{})
		})
	}
}

// TestExportRefusesExperts: a mixture of experts is refused up front with what to use instead,
// and nothing is written.
func TestExportRefusesExperts(t *testing.T) {
	src := t.TempDir()
	if err := synth.Write(src, synth.Config{Layers: 1, Hidden: 32, Intermediate: 16, Heads: 2, KVHeads: 2, Vocab: 40, Experts: 4, ExpertsPerToken: 2}); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "out")
	_, err := Export(src, dst, Options{})
	if err == nil || !strings.Contains(err.Error(), "mixture of experts (4 experts, 2 per token)") || !strings.Contains(err.Error(), "gguf") {
		t.Fatalf("error %v, want the mixture of experts refused", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("%s exists after a refused export", dst)
	}
}
