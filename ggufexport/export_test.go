package ggufexport_test

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/ggufexport"

	parser "github.com/gpustack/gguf-parser-go"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/npy"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

func tinyDir(t *testing.T) string { return testenv.Testdata(t, "models/tiny") }

func heldout(t *testing.T, dir string) []int {
	a, err := npy.ReadFile(filepath.Join(dir, "heldout_ids.npy"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := a.Ints()
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// ggufPerplexity evaluates an exported file, with the config of the checkpoint src, through the
// decoders and qpack's forward pass on the held-out ids of idsDir.
func ggufPerplexity(t *testing.T, path, src, idsDir string, seqs int) float64 {
	t.Helper()
	cfg, w := openWeights(t, path, src)
	defer w.Close()
	m, err := model.Load(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	r, err := model.Perplexity(m, heldout(t, idsDir), 512, seqs)
	if err != nil {
		t.Fatal(err)
	}
	return r.Perplexity
}

// openWeights opens an exported file with the config of the checkpoint src.
func openWeights(t *testing.T, path, src string) (*model.Config, *ggufexport.Weights) {
	t.Helper()
	cfg, err := model.LoadConfig(src)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ggufexport.OpenWeights(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, w
}

func sourcePerplexity(t *testing.T, dir, idsDir string, seqs int) float64 {
	t.Helper()
	m, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := model.Perplexity(m, heldout(t, idsDir), 512, seqs)
	if err != nil {
		t.Fatal(err)
	}
	return r.Perplexity
}

// An F32 export is lossless: decoded, with q/k rows put back, the model computes the source's
// perplexity exactly; gguf-parser-go reads llama.cpp's metadata from it.
func TestExportTinyF32IsExact(t *testing.T) {
	src := tinyDir(t)
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	entries, err := ggufexport.Export(src, out, ggufexport.Options{Type: "f32", EmbedType: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2+4*9+1 {
		t.Fatalf("%d tensors, want %d", len(entries), 2+4*9+1)
	}
	got, want := ggufPerplexity(t, out, src, src, 2), sourcePerplexity(t, src, src, 2)
	if got != want {
		t.Fatalf("perplexity of the F32 export %v, source %v", got, want)
	}
	pf, err := parser.ParseGGUFFile(out)
	if err != nil {
		t.Fatal(err)
	}
	a, tk := pf.Architecture(), pf.Tokenizer()
	if a.Architecture != "llama" || a.EmbeddingLength != 128 || a.BlockCount != 4 || a.AttentionHeadCount != 4 ||
		a.AttentionHeadCountKV != 2 || a.FeedForwardLength[0] != 384 || a.MaximumContextLength != 1024 {
		t.Fatalf("gguf-parser-go architecture: %+v", a)
	}
	if tk.Model != "gpt2" || tk.TokensLength != 2048 || tk.MergesLength == 0 || tk.BOSTokenID != 0 || tk.EOSTokenID != 0 {
		t.Fatalf("gguf-parser-go tokenizer: %+v", tk)
	}
	g, _ := gguf.Open(out)
	defer g.Close()
	if v, _ := g.Get("tokenizer.ggml.pre"); v != "gpt-2" {
		t.Fatalf("tokenizer.ggml.pre = %v", v)
	}
	if v, _ := g.Get("general.file_type"); v != uint32(0) {
		t.Fatalf("file_type = %v, want 0 (all F32)", v)
	}
}

// The q/k permutation against convert_hf_to_gguf.py's formula, written independently:
// reshape(n_head, 2, hd/2, K).swapaxes(1, 2): GGUF row h·hd + 2i + j is HF row h·hd + j·hd/2 + i.
func TestExportPermutesLlamaQK(t *testing.T) {
	src := tinyDir(t)
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	if _, err := ggufexport.Export(src, out, ggufexport.Options{Type: "f32", EmbedType: "f16"}); err != nil {
		t.Fatal(err)
	}
	in, _ := safetensors.Open(src)
	defer in.Close()
	g, _ := gguf.Open(out)
	defer g.Close()
	for _, c := range []struct {
		hf, gg string
		heads  int
	}{{"model.layers.1.self_attn.q_proj.weight", "blk.1.attn_q.weight", 4}, {"model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight", 2},
		{"model.layers.1.self_attn.v_proj.weight", "blk.1.attn_v.weight", 0}} {
		hf, _ := in.Float32(c.hf)
		ti, _ := g.Tensor(c.gg)
		b, _ := g.Bytes(ti)
		k, hd := 128, 32
		for row := range len(hf) / k {
			srcRow := row
			if c.heads > 0 {
				h, rest := row/hd, row%hd
				i, j := rest/2, rest%2
				srcRow = h*hd + j*hd/2 + i
			}
			for x := range k {
				v := math.Float32frombits(binary.LittleEndian.Uint32(b[4*(row*k+x):]))
				if v != hf[srcRow*k+x] {
					t.Fatalf("%s row %d col %d: %v, want HF row %d's %v", c.gg, row, x, v, srcRow, hf[srcRow*k+x])
				}
			}
		}
	}
}

// A checkpoint whose schemes are ggml blocks (int8-g32-sym, int4-g32-sym), in qpack's or
// another layout, exports losslessly: the GGUF model's perplexity is the checkpoint's, exactly.
func TestExportLosslessRepack(t *testing.T) {
	src := tinyDir(t)
	for _, c := range []struct {
		s      quant.Scheme
		format string
	}{{quant.Scheme{Bits: 8, GroupSize: 32, Sym: true}, "qpack"}, {quant.Scheme{Bits: 4, GroupSize: 32, Sym: true}, "qpack"},
		{quant.Scheme{Bits: 4, GroupSize: 32, Sym: true}, "gptq"}, {quant.Scheme{Bits: 8, GroupSize: 32, Sym: true}, "compressed-tensors"}} {
		s := c.s
		dir := t.TempDir()
		opt := convert.DefaultOptions()
		opt.Alloc, opt.Format = convert.Uniform(s), c.format
		if _, err := convert.Convert(src, filepath.Join(dir, "q"), opt); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "q.gguf")
		entries, err := ggufexport.Export(filepath.Join(dir, "q"), out, ggufexport.Options{EmbedType: "f32"}) // tiny keeps F32 embeddings
		if err != nil {
			t.Fatal(err)
		}
		want := map[int]gguf.Type{8: gguf.Q8_0, 4: gguf.Q4_0}[s.Bits]
		var repacked int
		for _, e := range entries {
			if strings.HasPrefix(e.How, "repacked losslessly") {
				repacked++
				if e.Type != want {
					t.Fatalf("%s: %s, want %s", e.Name, e.Type, want)
				}
			}
		}
		if repacked != 4*7 {
			t.Fatalf("%s %s: %d tensors repacked, want 28", c.format, s, repacked)
		}
		got, ref := ggufPerplexity(t, out, filepath.Join(dir, "q"), src, 2), sourcePerplexity(t, filepath.Join(dir, "q"), src, 2)
		if got != ref {
			t.Fatalf("%s %s: perplexity of the GGUF %v, of the checkpoint %v", c.format, s, got, ref)
		}
		t.Logf("%s %s → %s: perplexity %.4f (the same as the checkpoint)", c.format, s, want, got)
	}
}

// A scheme with no ggml equivalent is refused by name; --requantize takes the lossy way.
func TestExportRefusesUnmappableScheme(t *testing.T) {
	src := tinyDir(t)
	dir := t.TempDir()
	opt := convert.DefaultOptions()
	opt.Alloc, opt.Format = convert.Uniform(quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}), "qpack"
	if _, err := convert.Convert(src, filepath.Join(dir, "q"), opt); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "q.gguf")
	_, err := ggufexport.Export(filepath.Join(dir, "q"), out, ggufexport.Options{})
	if err == nil || !strings.Contains(err.Error(), "int4-g128-sym maps onto no ggml type") || !strings.Contains(err.Error(), "model.layers.0.") {
		t.Fatalf("want a refusal naming the module and scheme, got %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatal("a refused export left a file")
	}
	entries, err := ggufexport.Export(filepath.Join(dir, "q"), out, ggufexport.Options{Requantize: true, Type: "q8_0"})
	if err != nil {
		t.Fatal(err)
	}
	if e := entries[2]; e.Type != gguf.Q8_0 || !strings.Contains(e.How, "requantized (lossy, from int4-g128-sym)") {
		t.Fatalf("entry %+v", e)
	}
}

// copyModel copies a checkpoint directory so a test can edit it.
func copyModel(t *testing.T, src string) string {
	dst := t.TempDir()
	for _, f := range []string{"config.json", "tokenizer.json", "model.safetensors", "heldout_ids.npy"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dst, f), b, 0o644)
	}
	return dst
}

func editConfig(t *testing.T, dir string, edit func(map[string]any)) {
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	var c map[string]any
	json.Unmarshal(b, &c)
	edit(c)
	b, _ = json.Marshal(c)
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

func TestExportBadInput(t *testing.T) {
	src := tinyDir(t)
	cases := []struct {
		want  string
		setup func(dir string)
		opts  ggufexport.Options
	}{
		{"model_type \"qwen3\" has no GGUF export", func(d string) {
			editConfig(t, d, func(c map[string]any) { c["model_type"], c["architectures"] = "qwen3", []string{"Qwen3ForCausalLM"} })
		}, ggufexport.Options{}},
		{"no tokenizer.json", func(d string) { os.Remove(filepath.Join(d, "tokenizer.json")) }, ggufexport.Options{}},
		{"unknown ggml type \"q9\"", func(string) {}, ggufexport.Options{Type: "q9"}},
		{"pre-tokenizer", func(d string) { editTokenizer(t, d) }, ggufexport.Options{}},
	}
	for _, c := range cases {
		dir := copyModel(t, src)
		c.setup(dir)
		out := filepath.Join(dir, "m.gguf")
		_, err := ggufexport.Export(dir, out, c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error containing %q, got %v", c.want, err)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%q: a failed export left a file", c.want)
		}
	}
}

// editTokenizer gives the tokenizer a pre-tokenizer llama.cpp has no name for.
func editTokenizer(t *testing.T, dir string) {
	b, _ := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	var c map[string]any
	json.Unmarshal(b, &c)
	c["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}
	b, _ = json.Marshal(c)
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644)
}

// qwen2: its own KV prefix, q/k rows not permuted (Qwen2 uses rotate-half in llama.cpp too),
// and the decoded model still computes the source's perplexity exactly.
func TestExportQwen2(t *testing.T) {
	dir := copyModel(t, tinyDir(t))
	editConfig(t, dir, func(c map[string]any) {
		c["model_type"], c["architectures"] = "qwen2", []string{"Qwen2ForCausalLM"}
	})
	out := filepath.Join(t.TempDir(), "q.gguf")
	if _, err := ggufexport.Export(dir, out, ggufexport.Options{Type: "f32", EmbedType: "f32"}); err != nil {
		t.Fatal(err)
	}
	g, _ := gguf.Open(out)
	defer g.Close()
	if v, _ := g.Get("general.architecture"); v != "qwen2" {
		t.Fatalf("architecture %v", v)
	}
	if v, _ := g.Get("qwen2.attention.head_count_kv"); v != uint32(2) {
		t.Fatalf("qwen2.attention.head_count_kv = %v", v)
	}
	in, _ := safetensors.Open(dir)
	defer in.Close()
	hf, _ := in.Float32("model.layers.0.self_attn.q_proj.weight")
	ti, _ := g.Tensor("blk.0.attn_q.weight")
	b, _ := g.Bytes(ti)
	for i, v := range hf {
		if math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) != v {
			t.Fatalf("qwen2 attn_q element %d differs from q_proj: rows must not be permuted", i)
		}
	}
	if got, want := ggufPerplexity(t, out, dir, dir, 1), sourcePerplexity(t, dir, dir, 1); got != want {
		t.Fatalf("qwen2 export perplexity %v, source %v", got, want)
	}
}
