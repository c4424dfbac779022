package ggufexport_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/ggufexport"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/safetensors"
	"github.com/qpack-dev/qpack/tokenizer"
)

// An F32 export read back with ggufexport.OpenModel — its architecture from the GGUF metadata alone —
// computes the source's perplexity exactly, for llama (q/k rows permuted) and qwen2.
func TestOpenModelIsExact(t *testing.T) {
	for _, arch := range []string{"llama", "qwen2"} {
		src := copyModel(t, tinyDir(t))
		if arch == "qwen2" {
			editConfig(t, src, func(c map[string]any) { c["model_type"], c["architectures"] = "qwen2", []string{"Qwen2ForCausalLM"} })
		}
		out := filepath.Join(t.TempDir(), "tiny.gguf")
		if _, err := ggufexport.Export(src, out, ggufexport.Options{Type: "f32", EmbedType: "f32"}); err != nil {
			t.Fatal(err)
		}
		m, err := ggufexport.OpenModel(out)
		if err != nil {
			t.Fatal(err)
		}
		want, err := model.LoadConfig(src)
		if err != nil {
			t.Fatal(err)
		}
		want.Rope.Theta = float64(float32(want.Rope.Theta)) // GGUF stores float32
		want.RMSNormEps = float64(float32(want.RMSNormEps))
		if !reflect.DeepEqual(m.Config, want) {
			t.Errorf("%s: config from GGUF %+v\nfrom config.json %+v", arch, m.Config, want)
		}
		r, err := model.Perplexity(m, heldout(t, src), 512, 1)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		if src := sourcePerplexity(t, src, src, 1); r.Perplexity != src {
			t.Errorf("%s: perplexity %v from the GGUF file, %v from the source", arch, r.Perplexity, src)
		}
	}
}

// The tokenizer rebuilt from a GGUF file's metadata encodes the held-out text exactly as
// the checkpoint's tokenizer.json does.
func TestTokenizerFromGGUF(t *testing.T) {
	src := tinyDir(t)
	f := exportTiny(t)
	defer f.Close()
	got, err := ggufexport.Tokenizer(f)
	if err != nil {
		t.Fatal(err)
	}
	want, err := tokenizer.Load(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(src, "heldout.txt"))
	if err != nil {
		t.Fatal(err)
	}
	text = text[:20000]
	text = append(text, "<|endoftext|> and again"...)
	a, b := got.Encode(string(text)), want.Encode(string(text))
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("rebuilt tokenizer gives %d ids, tokenizer.json %d (first difference at %d)", len(a), len(b), firstDiff(a, b))
	}
}

// exportTiny exports tiny in F16 and opens the file.
func exportTiny(t *testing.T) *gguf.File {
	t.Helper()
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	if _, err := ggufexport.Export(tinyDir(t), out, ggufexport.Options{}); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// ggufexport.ConfigOf refuses metadata it cannot turn into a model, naming what is wrong.
func TestConfigOfBadMetadata(t *testing.T) {
	f := exportTiny(t)
	defer f.Close()
	good := f.KVs
	for _, c := range []struct {
		key   string
		value any // nil: remove the key
		want  string
	}{
		{"general.architecture", "gpt2", "llama, qwen2"},
		{"llama.block_count", nil, "block_count"},
		{"llama.feed_forward_length", []uint32{384, 384}, "per-layer"},
		{"llama.attention.head_count_kv", uint32(3), "inconsistent"},
		{"llama.rope.dimension_count", uint32(16), "partial rotary"},
		{"llama.rope.scaling.type", "yarn", "yarn"},
	} {
		f.KVs = nil
		for _, kv := range good {
			if kv.Key == c.key {
				if c.value == nil {
					continue
				}
				kv.Value = c.value
			}
			f.KVs = append(f.KVs, kv)
		}
		if c.key == "llama.rope.scaling.type" {
			f.KVs = append(f.KVs, gguf.KV{Key: c.key, Value: c.value})
		}
		if _, err := ggufexport.ConfigOf(f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s = %v: error %v, want one mentioning %q", c.key, c.value, err, c.want)
		}
	}
}

// Dequantize writes a checkpoint that qpack loads as the same model as the GGUF file (F32:
// exactly the decoded weights), with a config.json and a tokenizer.json that reproduce it.
func TestDequantizeGGUF(t *testing.T) {
	src := tinyDir(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "q8.gguf")
	if _, err := ggufexport.Export(src, out, ggufexport.Options{Type: "q8_0", EmbedType: "q8_0"}); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := ggufexport.Dequantize(out, plain, safetensors.F32, false, 0); err != nil {
		t.Fatal(err)
	}
	if err := ggufexport.Dequantize(out, plain, safetensors.F32, false, 0); err == nil {
		t.Error("dequantized over an existing directory")
	}
	g, err := ggufexport.OpenModel(out)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	a, err := model.Perplexity(g, heldout(t, src), 512, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b := sourcePerplexity(t, plain, src, 1); a.Perplexity != b {
		t.Errorf("dequantized checkpoint: perplexity %v, the GGUF file %v", b, a.Perplexity)
	}
	tok, err := tokenizer.Load(filepath.Join(plain, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := tokenizer.Load(filepath.Join(src, "tokenizer.json"))
	text := "def f(x):\n    return x ** 2  # <|endoftext|>"
	if !reflect.DeepEqual(tok.Encode(text), want.Encode(text)) {
		t.Error("the rebuilt tokenizer.json encodes differently")
	}
}
