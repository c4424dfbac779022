// Package moetest makes mixture-of-experts test checkpoints out of a dense one, so that tests of
// several packages run trained attention and MLP weights through experts.
package moetest

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/safetensors"
)

// FromDense writes the dense checkpoint src (the tiny test model) as a mixture of experts of
// family ("mixtral", "qwen2_moe" or "qwen3_moe") in F32 in a temporary directory, with its
// config (changed by edit when not nil), tokenizer and held-out ids: each block's MLP becomes 4
// experts, expert e the dense MLP with every weight scaled by its own 1 ± 0.3 noise, routed
// top-2 by a random router; qwen2_moe adds q/k/v biases and a shared expert (the dense MLP)
// with its gate, qwen3_moe q/k norms. Deterministic: a fixed seed.
func FromDense(t testing.TB, src, family string, edit func(map[string]any)) string {
	t.Helper()
	dir := t.TempDir()
	copyFiles(t, src, dir)
	in, err := safetensors.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	arch := map[string]string{"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[family]
	editConfig(t, dir, func(c map[string]any) {
		c["model_type"], c["architectures"] = family, []string{arch}
		c["num_local_experts"], c["num_experts_per_tok"], c["moe_intermediate_size"] = 4, 2, c["intermediate_size"]
		c["norm_topk_prob"] = family != "qwen2_moe"
		if family == "qwen2_moe" {
			c["shared_expert_intermediate_size"] = c["intermediate_size"]
		}
		if edit != nil {
			edit(c)
		}
	})
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(2024, 5))
	var ts []safetensors.WriterTensor
	put := func(name string, shape []int, v []float32) {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		ts = append(ts, safetensors.BytesTensor(name, safetensors.F32, shape, b))
	}
	random := func(n int, std, mean float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(mean + std*r.NormFloat64())
		}
		return v
	}
	noisy := func(w []float32) []float32 {
		out := make([]float32, len(w))
		for i, x := range w {
			out[i] = x * float32(1+0.3*r.NormFloat64())
		}
		return out
	}
	h := cfg.Hidden
	for _, name := range in.Names() {
		v, _ := in.Float32(name)
		shape, _ := in.Shape(name)
		tn := model.ParseTensorName(name)
		if !strings.Contains(name, ".mlp.") {
			put(name, shape, v)
			continue
		}
		if tn.Role != model.RoleMLPGate { // each block's experts are written once, at its gate_proj
			continue
		}
		p := strings.TrimSuffix(name, "gate_proj.weight")
		up, _ := in.Float32(p + "up_proj.weight")
		down, _ := in.Float32(p + "down_proj.weight")
		n := cfg.MoENames(tn.Block, func(string) bool { return family == "mixtral" })
		put(n.Router+".weight", []int{4, h}, random(4*h, 3/math.Sqrt(float64(h)), 0))
		for e := range 4 {
			put(n.Gate[e]+".weight", shape, noisy(v))
			put(n.Up[e]+".weight", shape, noisy(up))
			put(n.Down[e]+".weight", []int{shape[1], shape[0]}, noisy(down))
		}
		if n.SharedGate != "" {
			put(n.Shared[0]+".weight", shape, v)
			put(n.Shared[1]+".weight", shape, up)
			put(n.Shared[2]+".weight", []int{shape[1], shape[0]}, down)
			put(n.SharedGate+".weight", []int{1, h}, random(h, 0.1, 0))
		}
	}
	for i := range cfg.Layers {
		p := "model.layers." + strconv.Itoa(i) + ".self_attn."
		if family == "qwen2_moe" {
			kv := cfg.KVHeads * cfg.HeadDim
			for _, m := range []struct {
				name string
				n    int
			}{{"q_proj", h}, {"k_proj", kv}, {"v_proj", kv}} {
				put(p+m.name+".bias", []int{m.n}, random(m.n, 0.05, 0))
			}
		}
		if cfg.QKNorm {
			put(p+"q_norm.weight", []int{cfg.HeadDim}, random(cfg.HeadDim, 0.1, 1))
			put(p+"k_norm.weight", []int{cfg.HeadDim}, random(cfg.HeadDim, 0.1, 1))
		}
	}
	os.Remove(filepath.Join(dir, "model.safetensors"))
	if _, err := safetensors.WriteCheckpoint(dir, ts, nil, 0); err != nil {
		t.Fatal(err)
	}
	return dir
}

// copyFiles copies the checkpoint's config, tokenizer and held-out ids (the weights are
// rewritten).
func copyFiles(t testing.TB, src, dst string) {
	t.Helper()
	for _, f := range []string{"config.json", "tokenizer.json", "heldout_ids.npy", "heldout.txt"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// editConfig rewrites dir's config.json through edit.
func editConfig(t testing.TB, dir string, edit func(map[string]any)) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	edit(c)
	if b, err = json.Marshal(c); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
