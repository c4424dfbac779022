package ggufexport_test

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/internal/moetest"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// openModel opens a checkpoint, closed with the test.
func openModel(t *testing.T, dir string) *model.Model {
	t.Helper()
	m, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestExportMoEF32IsExact: each family's experts merge into ffn_*_exps [experts, N, K] (the
// router F32, Qwen2-MoE's shared expert and its gate as *_shexp), with the experts' KVs, and
// the decoded model computes the source's perplexity exactly; llama.cpp (c392e509, Feb 2025,
// /work/tools/score: the first held-out sequence of 512) computed the same perplexity from
// the files within 1e-3 (it has no qwen3moe yet).
func TestExportMoEF32IsExact(t *testing.T) {
	for _, c := range []struct {
		family, arch string
		tensors      int
		llamaCpp     float64
	}{ // token_embd, output_norm, output; per block 5 attention tensors, ffn_norm, the router, 3 merged
		{"mixtral", "llama", 3 + 4*10, 65.010545}, {"qwen2_moe", "qwen2moe", 3 + 4*(10+3+4), 102.098080},
		{"qwen3_moe", "qwen3moe", 3 + 4*(10+2), 0}} {
		t.Run(c.family, func(t *testing.T) {
			dir := moetest.FromDense(t, tinyDir(t), c.family, nil)
			out := filepath.Join(t.TempDir(), "m.gguf")
			entries, err := ggufexport.Export(dir, out, ggufexport.Options{Type: "f32", EmbedType: "f32"})
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != c.tensors {
				t.Errorf("%d tensors, want %d", len(entries), c.tensors)
			}
			g, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			for k, want := range map[string]any{"general.architecture": c.arch, c.arch + ".expert_count": uint32(4), c.arch + ".expert_used_count": uint32(2)} {
				if v, _ := g.Get(k); v != want {
					t.Errorf("%s = %v, want %v", k, v, want)
				}
			}
			if ti, ok := g.Tensor("blk.2.ffn_down_exps.weight"); !ok || ti.Dims[0] != 384 || ti.Dims[1] != 128 || ti.Dims[2] != 4 {
				t.Errorf("ffn_down_exps: %+v", ti)
			}
			if ti, ok := g.Tensor("blk.0.ffn_gate_inp.weight"); !ok || ti.Type != gguf.F32 || ti.Dims[0] != 128 || ti.Dims[1] != 4 {
				t.Errorf("ffn_gate_inp: %+v", ti)
			}
			got, want := ggufPerplexity(t, out, dir, dir, 1), sourcePerplexity(t, dir, dir, 1)
			t.Logf("%s: perplexity %.4f", c.family, got)
			if got != want {
				t.Fatalf("perplexity of the F32 export %v, source %v", got, want)
			}
			if c.llamaCpp != 0 && math.Abs(got/c.llamaCpp-1) > 1e-3 {
				t.Errorf("perplexity %.6f, llama.cpp computed %.6f from the same file", got, c.llamaCpp)
			}
			// The file alone says it is a mixture of experts (what `qpack eval FILE.gguf` reads),
			// and dequantizes to a checkpoint qpack and transformers load as one.
			m, err := ggufexport.OpenModel(out)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			plain := filepath.Join(t.TempDir(), "plain")
			if err := ggufexport.Dequantize(out, plain, safetensors.F32, false, 0); err != nil {
				t.Fatal(err)
			}
			for what, m := range map[string]*model.Model{"the file alone": m, "its dequantized checkpoint": openModel(t, plain)} {
				r, err := model.Perplexity(m, heldout(t, dir), 512, 1)
				if err != nil {
					t.Fatal(err)
				}
				if r.Perplexity != want {
					t.Errorf("perplexity of %s %v, source %v", what, r.Perplexity, want)
				}
			}
		})
	}
}

// TestExportMoERepack: a GPTQ int4-g32-sym checkpoint of a mixture of experts exports every
// merged expert tensor losslessly as Q4_0; experts of one block with different schemes are
// refused by name unless --requantize.
func TestExportMoERepack(t *testing.T) {
	dir := moetest.FromDense(t, tinyDir(t), "mixtral", nil)
	q := filepath.Join(t.TempDir(), "q")
	opt := convert.DefaultOptions()
	opt.Alloc = convert.Uniform(quant.Scheme{Bits: 4, GroupSize: 32, Sym: true})
	opt.InputHash = convert.HashNone
	if _, err := convert.Convert(dir, q, opt); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "q.gguf")
	entries, err := ggufexport.Export(q, out, ggufexport.Options{EmbedType: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	merged := 0
	for _, e := range entries {
		if strings.Contains(e.Name, "_exps") {
			merged++
			if e.Type != gguf.Q4_0 || !strings.Contains(e.How, "repacked losslessly (int4-g32-sym) (4 experts)") {
				t.Errorf("%s: %s, %s", e.Name, e.Type, e.How)
			}
		}
	}
	if merged != 3*4 {
		t.Errorf("%d merged expert tensors, want 12", merged)
	}
	if got, want := ggufPerplexity(t, out, q, dir, 1), sourcePerplexity(t, q, dir, 1); got != want {
		t.Fatalf("perplexity of the GGUF %v, of the checkpoint %v", got, want)
	}

	opt.Alloc.Overrides, err = alloc.ParseOverrides([]string{`layers\.1\..*experts\.3\.w2=int8-g32-sym`})
	if err != nil {
		t.Fatal(err)
	}
	mixed := filepath.Join(t.TempDir(), "mixed")
	opt.Format = "qpack" // one scheme per tensor
	if _, err := convert.Convert(dir, mixed, opt); err != nil {
		t.Fatal(err)
	}
	_, err = ggufexport.Export(mixed, out+"2", ggufexport.Options{})
	if err == nil || !strings.Contains(err.Error(), "blk.1.ffn_down_exps.weight") || !strings.Contains(err.Error(), "expert 3") || !strings.Contains(err.Error(), "Q8_0") {
		t.Fatalf("mixed expert schemes: error %v", err)
	}
	entries, err = ggufexport.Export(mixed, out+"3", ggufexport.Options{Requantize: true, Type: "q8_0"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name == "blk.1.ffn_down_exps.weight" && (e.Type != gguf.Q8_0 || !strings.Contains(e.How, "requantized")) {
			t.Errorf("%+v", e)
		}
	}
}

// TestExportMoERefusals: what llama.cpp's architectures cannot compute is refused up front.
func TestExportMoERefusals(t *testing.T) {
	for _, c := range []struct {
		family, want string
		edit         func(map[string]any)
	}{
		{"qwen3_moe", "norm_topk_prob is false, but llama.cpp's qwen3moe always computes it as true", func(c map[string]any) { c["norm_topk_prob"] = false }},
		{"qwen2_moe", "norm_topk_prob is true", func(c map[string]any) { c["norm_topk_prob"] = true }},
		{"qwen3_moe", "block 0 has a dense MLP", func(c map[string]any) { c["decoder_sparse_step"] = 2 }},
	} {
		dir := moetest.FromDense(t, tinyDir(t), c.family, c.edit)
		out := filepath.Join(t.TempDir(), "m.gguf")
		if _, err := ggufexport.Export(dir, out, ggufexport.Options{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.family, err, c.want)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("a refused export left a file")
		}
	}
}
