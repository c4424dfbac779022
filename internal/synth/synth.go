// Package synth writes synthetic Llama-shaped (or, with experts, Mixtral-shaped) checkpoints of
// any size with random BF16 weights, one tensor in memory at a time, for memory and speed
// measurements at 7B scale and beyond.
package synth

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/npy"
	"github.com/qpack-dev/qpack/safetensors"
)

// Config gives the shape of the model.
type Config struct {
	Layers       int
	Hidden       int
	Intermediate int
	Heads        int
	KVHeads      int
	Vocab        int
	MaxShard     int64 // bytes per output shard; 0 = 5 GB
	Seed         uint64
	// Experts, when set, makes every MLP a mixture of that many experts of Intermediate each
	// (Mixtral's layout and config), ExpertsPerToken of them per token.
	Experts, ExpertsPerToken int
	// CalibIDs, when set, also writes calib_ids.npy: that many random token ids, calibration
	// data for the model (it has no tokenizer).
	CalibIDs int
}

// CalibIDsFile is the name of the calibration ids Write adds when Config.CalibIDs is set.
const CalibIDsFile = "calib_ids.npy"

// Mixtral8x7B is the shape of Mixtral-8x7B.
var Mixtral8x7B = Config{Layers: 32, Hidden: 4096, Intermediate: 14336, Heads: 32, KVHeads: 8, Vocab: 32000, Experts: 8, ExpertsPerToken: 2}

// Llama2_7B is the shape of Llama-2-7B.
var Llama2_7B = Config{Layers: 32, Hidden: 4096, Intermediate: 11008, Heads: 32, KVHeads: 32, Vocab: 32000}

// Write creates dir with config.json and the weights.
func Write(dir string, c Config) error {
	if c.Layers <= 0 || c.Hidden <= 0 || c.Intermediate <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.Vocab <= 0 ||
		c.Hidden%c.Heads != 0 || c.Heads%c.KVHeads != 0 || c.Experts < 0 || c.CalibIDs < 0 || (c.Experts > 0 && (c.ExpertsPerToken < 1 || c.ExpertsPerToken > c.Experts)) {
		return fmt.Errorf("synth: invalid shape %+v", c)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if c.MaxShard == 0 {
		c.MaxShard = 5e9
	}
	if err := writeConfig(dir, c); err != nil {
		return err
	}
	if c.CalibIDs > 0 {
		r := rand.New(rand.NewPCG(c.Seed, 0x5eed))
		ids := make([]int32, c.CalibIDs)
		for i := range ids {
			ids[i] = int32(r.IntN(c.Vocab))
		}
		if err := os.WriteFile(filepath.Join(dir, CalibIDsFile), npy.EncodeInt32s(ids), 0o644); err != nil {
			return err
		}
	}
	_, err := safetensors.WriteCheckpoint(dir, tensors(c), nil, c.MaxShard)
	return err
}

func writeConfig(dir string, c Config) error {
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "hidden_size": c.Hidden,
		"intermediate_size": c.Intermediate, "num_hidden_layers": c.Layers, "num_attention_heads": c.Heads,
		"num_key_value_heads": c.KVHeads, "vocab_size": c.Vocab, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
		"max_position_embeddings": 4096, "hidden_act": "silu", "tie_word_embeddings": false, "torch_dtype": "bfloat16",
	}
	if c.Experts > 0 {
		cfg["architectures"], cfg["model_type"] = []string{"MixtralForCausalLM"}, "mixtral"
		cfg["num_local_experts"], cfg["num_experts_per_tok"] = c.Experts, c.ExpertsPerToken
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

func tensors(c Config) []safetensors.WriterTensor {
	h, kv := c.Hidden, c.Hidden/c.Heads*c.KVHeads
	seed := c.Seed
	next := func() uint64 { seed++; return seed*0x9e3779b97f4a7c15 + 1 }
	var ts []safetensors.WriterTensor
	add := func(name string, shape ...int) {
		ts = append(ts, randomBF16(name, shape, next()))
	}
	norm := func(name string) { ts = append(ts, onesBF16(name, h)) }
	add("model.embed_tokens.weight", c.Vocab, h)
	for l := range c.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		norm(p + "input_layernorm.weight")
		add(p+"self_attn.q_proj.weight", h, h)
		add(p+"self_attn.k_proj.weight", kv, h)
		add(p+"self_attn.v_proj.weight", kv, h)
		add(p+"self_attn.o_proj.weight", h, h)
		norm(p + "post_attention_layernorm.weight")
		if c.Experts == 0 {
			add(p+"mlp.gate_proj.weight", c.Intermediate, h)
			add(p+"mlp.up_proj.weight", c.Intermediate, h)
			add(p+"mlp.down_proj.weight", h, c.Intermediate)
			continue
		}
		add(p+"block_sparse_moe.gate.weight", c.Experts, h)
		for e := range c.Experts {
			x := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", p, e)
			add(x+"w1.weight", c.Intermediate, h)
			add(x+"w2.weight", h, c.Intermediate)
			add(x+"w3.weight", c.Intermediate, h)
		}
	}
	norm("model.norm.weight")
	add("lm_head.weight", c.Vocab, h)
	return ts
}

func onesBF16(name string, n int) safetensors.WriterTensor {
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], fp.F32ToBF16(1))
	}
	return safetensors.BytesTensor(name, safetensors.BF16, []int{n}, b)
}

// randomBF16 generates roughly normal weights (std 0.02, a few 10× outliers) a chunk of rows at
// a time on all cores, so a 7B model is written in seconds and at most one tensor is in memory.
func randomBF16(name string, shape []int, seed uint64) safetensors.WriterTensor {
	return safetensors.WriterTensor{Name: name, DType: safetensors.BF16, Shape: shape, WriteTo: func(w io.Writer) error {
		n := shape[0] * shape[1]
		buf := make([]byte, 2*n)
		workers := runtime.GOMAXPROCS(0)
		chunk := (n + workers - 1) / workers
		var wg sync.WaitGroup
		for start := 0; start < n; start += chunk {
			end := min(start+chunk, n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				fill(buf[2*start:2*end], seed^uint64(start)*0xbf58476d1ce4e5b9)
			}()
		}
		wg.Wait()
		_, err := w.Write(buf)
		return err
	}}
}

// fill writes BF16 values: the sum of four uniforms (≈ normal), scaled to std 0.02, with one
// value in 4096 made 10× larger, as real weights have outlier channels.
func fill(dst []byte, state uint64) {
	if state == 0 {
		state = 1
	}
	const scale = 0.02 / 0.57735 // std of a sum of 4 U(−0.5, 0.5) is sqrt(4/12)
	for i := 0; i+1 < len(dst); i += 2 {
		state ^= state << 13
		state ^= state >> 7
		state ^= state << 17
		u := state
		s := float32(int64(u&0xffff)+int64(u>>16&0xffff)+int64(u>>32&0xffff)+int64(u>>48&0xffff)-2*0xffff) / 0xffff
		v := s * scale
		if u&0xfff == 0 {
			v *= 10
		}
		binary.LittleEndian.PutUint16(dst[i:], fp.F32ToBF16(v))
	}
}
