package ggufexport

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/internal/staged"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/safetensors"
)

// Dequantize writes a GGUF file of a llama or qwen2 model as a plain Hugging Face checkpoint
// directory: every tensor decoded and stored in dtype (F16, BF16 or F32) under its Hugging Face
// name (q/k rows put back), config.json from the metadata, and tokenizer.json rebuilt from the
// tokenizer the file carries. Shards hold at most maxShard bytes (0: 5 GB).
func Dequantize(path, dst string, dtype safetensors.DType, overwrite bool, maxShard int64) error {
	if dtype != safetensors.F16 && dtype != safetensors.BF16 && dtype != safetensors.F32 {
		return fmt.Errorf("dequantize: dtype %s is not one of F16, BF16, F32", dtype)
	}
	if err := staged.CheckDestination(dst, overwrite); err != nil {
		return err
	}
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	cfg, err := ConfigOf(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tok, err := tokenizerJSON(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	w := newWeights(f, cfg)
	var tensors []safetensors.WriterTensor
	for _, r := range roles(w.arch(), cfg, func(string) bool { return w.arch() == "llama" }) {
		names := []string{r.hf}
		if r.experts != nil {
			names = r.experts // a merged tensor: each expert is a tensor of the checkpoint
		}
		for _, name := range names {
			shape, ok := w.Shape(name)
			if !ok {
				if r.optional {
					continue
				}
				return fmt.Errorf("%s: no tensor %s (for %s)", path, r.gguf, name)
			}
			tensors = append(tensors, safetensors.WriterTensor{Name: name, DType: dtype, Shape: shape, WriteTo: func(out io.Writer) error {
				v, err := w.Float32(name)
				if err != nil {
					return err
				}
				_, err = out.Write(safetensors.EncodeFloat32(dtype, v))
				return err
			}})
		}
	}
	if maxShard == 0 {
		maxShard = 5e9
	}
	return staged.Dir(dst, overwrite, nil, func(dir string) error {
		meta := map[string]string{"qpack.dequantized_from": "gguf " + filepath.Base(path)}
		if _, err := safetensors.WriteCheckpoint(dir, tensors, meta, maxShard); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o666); err != nil {
			return err
		}
		return writeConfig(filepath.Join(dir, "config.json"), f, cfg, dtype)
	})
}

// writeConfig writes the config.json a Hugging Face loader (and qpack) needs for cfg.
func writeConfig(path string, f *gguf.File, cfg *model.Config, dtype safetensors.DType) error {
	torch := map[safetensors.DType]string{safetensors.F16: "float16", safetensors.BF16: "bfloat16", safetensors.F32: "float32"}
	c := map[string]any{
		"architectures": []string{cfg.Architecture}, "model_type": cfg.ModelType, "hidden_size": cfg.Hidden,
		"intermediate_size": cfg.Intermediate, "num_hidden_layers": cfg.Layers, "num_attention_heads": cfg.Heads,
		"num_key_value_heads": cfg.KVHeads, "head_dim": cfg.HeadDim, "vocab_size": cfg.Vocab, "rms_norm_eps": cfg.RMSNormEps,
		"rope_theta": cfg.Rope.Theta, "tie_word_embeddings": cfg.TieEmbeddings, "hidden_act": "silu", "torch_dtype": torch[dtype],
	}
	if m := cfg.MoE; m.Experts > 0 { // every block sparse (readMoE)
		c["num_local_experts"], c["num_experts"], c["num_experts_per_tok"] = m.Experts, m.Experts, m.TopK
		c["moe_intermediate_size"], c["norm_topk_prob"] = m.Intermediate, m.NormTopK
		if m.SharedIntermediate > 0 {
			c["shared_expert_intermediate_size"] = m.SharedIntermediate
		}
	}
	if cfg.Rope.Type == "linear" {
		c["rope_scaling"] = map[string]any{"rope_type": "linear", "factor": cfg.Rope.Factor}
	}
	arch := archOf[cfg.ModelType]
	if v, ok := f.Get(arch + ".context_length"); ok {
		c["max_position_embeddings"] = v
	}
	for _, id := range []struct{ gguf, hf string }{{"bos_token_id", "bos_token_id"}, {"eos_token_id", "eos_token_id"}, {"padding_token_id", "pad_token_id"}} {
		if v, ok := f.Get("tokenizer.ggml." + id.gguf); ok {
			c[id.hf] = v
		}
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o666)
}
