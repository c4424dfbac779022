package ftype

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/gguf"
)

// fixture is what llama-quantize (llama.cpp c392e509) wrote for one model: the input tensors
// (an F16 GGUF written by `qpack export gguf`) and, per file type with and without
// --imatrix, the type of every output tensor. File types llama-quantize refuses without an
// importance matrix have only the "+imatrix" entry.
type fixture struct {
	Model         string                       `json:"model"`
	Arch          string                       `json:"arch"`
	Layers        int                          `json:"layers"`
	Heads         int                          `json:"heads"`
	KVHeads       int                          `json:"kv_heads"`
	Tensors       []fixtureTensor              `json:"tensors"`
	LlamaQuantize map[string]map[string]string `json:"llama_quantize"`
}

type fixtureTensor struct {
	Name string   `json:"name"`
	Type string   `json:"type"`
	Dims []uint64 `json:"dims"`
}

func loadFixture(t *testing.T, name string) fixture {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var f fixture
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestChooseMatchesLlamaQuantize compares Choose with llama-quantize's output on mid-llama
// (every row a multiple of 256) and small-llama (rows of 384 and 1024: the fallbacks) for
// every file type llama-quantize knows, with and without an importance matrix.
func TestChooseMatchesLlamaQuantize(t *testing.T) {
	for _, file := range []string{"mid-llama.json", "small-llama.json"} {
		fx := loadFixture(t, file)
		var tensors []Tensor
		for _, ft := range fx.Tensors {
			typ, err := gguf.ParseType(ft.Type)
			if err != nil {
				t.Fatal(err)
			}
			tensors = append(tensors, Tensor{Name: ft.Name, Type: typ, Dims: ft.Dims})
		}
		m := Model{Arch: fx.Arch, Layers: fx.Layers, Heads: fx.Heads, KVHeads: fx.KVHeads}
		if len(fx.LlamaQuantize) < 50 {
			t.Fatalf("%s: only %d llama-quantize runs", file, len(fx.LlamaQuantize))
		}
		for key, want := range fx.LlamaQuantize {
			name, imatrix := strings.CutSuffix(key, "+imatrix")
			f, err := Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Choose(f, m, tensors, Options{Imatrix: imatrix})
			if err != nil {
				t.Fatalf("%s %s: %v", fx.Model, key, err)
			}
			if len(got) != len(want) {
				t.Fatalf("%s %s: %d choices, llama-quantize wrote %d tensors", fx.Model, key, len(got), len(want))
			}
			for _, c := range got {
				if c.Type.String() != want[c.Name] {
					t.Errorf("%s %s: %s is %s, llama-quantize wrote %s", fx.Model, key, c.Name, c.Type, want[c.Name])
				}
			}
		}
	}
}

func TestParse(t *testing.T) {
	for name, want := range map[string]FileType{"q4_k_m": MostlyQ4_KM, "Q4_K": MostlyQ4_KM, "IQ2_XS": IQ2_XS, " q8_0 ": MostlyQ8_0, "Q2_K_S": MostlyQ2_KS} {
		got, err := Parse(name)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	if _, err := Parse("Q4_K_X"); err == nil || !strings.Contains(err.Error(), "Q4_K_M") {
		t.Errorf("Parse(Q4_K_X): %v; want an error listing the known names", err)
	}
	names := Names()
	if !sort.StringsAreSorted(names) || len(names) != len(fileTypes) {
		t.Errorf("Names() = %v", names)
	}
}

// TestLoaderOrder checks llama.cpp's tensor order: outside blocks first, then by block
// number (10 after 9, unlike a plain string sort), then by name.
func TestLoaderOrder(t *testing.T) {
	names := []string{"blk.10.attn_v.weight", "output.weight", "blk.9.ffn_down.weight", "blk.9.attn_v.weight", "token_embd.weight"}
	var ts []Tensor
	for _, n := range names {
		ts = append(ts, Tensor{Name: n})
	}
	var got []string
	for _, i := range loaderOrder(ts) {
		got = append(got, names[i])
	}
	want := []string{"output.weight", "token_embd.weight", "blk.9.attn_v.weight", "blk.9.ffn_down.weight", "blk.10.attn_v.weight"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("order %v, want %v", got, want)
	}
}

// model32 is a 32-layer llama with 8 KV heads of 32 (GQA 4) and 4096-wide rows.
func model32() (Model, []Tensor) {
	m := Model{Arch: "llama", Layers: 32, Heads: 32, KVHeads: 8}
	ts := []Tensor{{Name: "token_embd.weight", Type: gguf.F16, Dims: []uint64{4096, 32000}},
		{Name: "output.weight", Type: gguf.F16, Dims: []uint64{4096, 32000}},
		{Name: "output_norm.weight", Type: gguf.F32, Dims: []uint64{4096}}}
	for i := range 32 {
		for _, n := range []string{"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"} {
			ts = append(ts, Tensor{Name: "blk." + strconv.Itoa(i) + "." + n + ".weight", Type: gguf.F16, Dims: []uint64{4096, 4096}})
		}
	}
	return m, ts
}

func typesOf(t *testing.T, f FileType, m Model, ts []Tensor, o Options) map[string]gguf.Type {
	cs, err := Choose(f, m, ts, o)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]gguf.Type{}
	for _, c := range cs {
		out[c.Name] = c.Type
	}
	return out
}

// TestQ4KMLayers checks use_more_bits on 32 layers (the first and last four, and every third
// in between get Q6_K in attn_v and ffn_down), which the small fixtures cannot exercise.
func TestQ4KMLayers(t *testing.T) {
	m, ts := model32()
	got := typesOf(t, MostlyQ4_KM, m, ts, Options{})
	var more []int
	for i := range 32 {
		down, v := got["blk."+strconv.Itoa(i)+".ffn_down.weight"], got["blk."+strconv.Itoa(i)+".attn_v.weight"]
		if down != v {
			t.Errorf("layer %d: ffn_down %s, attn_v %s", i, down, v)
		}
		if down == gguf.Q6_K {
			more = append(more, i)
		}
	}
	want := []int{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}
	if len(more) != len(want) {
		t.Fatalf("Q6_K layers %v, want %v", more, want)
	}
	for i := range want {
		if more[i] != want[i] {
			t.Fatalf("Q6_K layers %v, want %v", more, want)
		}
	}
	if got["output.weight"] != gguf.Q6_K || got["token_embd.weight"] != gguf.Q4_K || got["output_norm.weight"] != gguf.F32 {
		t.Errorf("output %s, token_embd %s, norm %s", got["output.weight"], got["token_embd.weight"], got["output_norm.weight"])
	}
}

func TestSpecialModels(t *testing.T) {
	m, ts := model32()
	m.Is70B = true // the 70B rule on attn_v: Q3_K/Q4_K become Q5_K
	if got := typesOf(t, MostlyQ3_KM, m, ts, Options{}); got["blk.20.attn_v.weight"] != gguf.Q5_K {
		t.Errorf("70B Q3_K_M attn_v: %s, want Q5_K", got["blk.20.attn_v.weight"])
	}
	m.Is70B, m.Experts = false, 8
	got := typesOf(t, MostlyQ4_KM, m, ts, Options{})
	if got["blk.5.attn_v.weight"] != gguf.Q8_0 || got["blk.5.attn_k.weight"] != gguf.Q8_0 || got["blk.5.attn_output.weight"] != gguf.Q5_K {
		t.Errorf("8 experts: attn_v %s, attn_k %s, attn_output %s; want Q8_0, Q8_0, Q5_K",
			got["blk.5.attn_v.weight"], got["blk.5.attn_k.weight"], got["blk.5.attn_output.weight"])
	}
	if !Is70B("llama", 80, 64, 8, 0) || Is70B("llama", 80, 64, 64, 0) || Is70B("llama", 80, 64, 8, 8) || !Is70B("qwen2", 80, 64, 8, 0) {
		t.Error("Is70B disagrees with llama.cpp's load_hparams")
	}
}

func TestOverridesAndErrors(t *testing.T) {
	m, ts := model32()
	q8, f16 := gguf.Q8_0, gguf.F16
	got := typesOf(t, IQ2_XS, m, ts, Options{Imatrix: true, EmbedType: &f16, OutputType: &q8})
	if got["token_embd.weight"] != gguf.F16 || got["output.weight"] != gguf.Q8_0 {
		t.Errorf("overrides: token_embd %s, output %s", got["token_embd.weight"], got["output.weight"])
	}
	// Tied embeddings: token_embd is treated as the output.
	tied := ts[:0:0]
	for _, x := range ts {
		if x.Name != "output.weight" {
			tied = append(tied, x)
		}
	}
	if got := typesOf(t, MostlyQ4_KM, m, tied, Options{}); got["token_embd.weight"] != gguf.Q6_K {
		t.Errorf("tied token_embd: %s, want Q6_K", got["token_embd.weight"])
	}
	odd := []Tensor{{Name: "blk.0.attn_q.weight", Type: gguf.F16, Dims: []uint64{100, 64}}}
	if _, err := Choose(MostlyQ8_0, Model{Arch: "llama", Layers: 1}, odd, Options{}); err == nil || !strings.Contains(err.Error(), "blk.0.attn_q.weight") {
		t.Errorf("rows of 100 in Q8_0: %v; want an error naming the tensor", err)
	}
	if got := typesOf(t, MostlyQ4_KM, Model{Arch: "llama", Layers: 1}, []Tensor{{Name: "blk.0.attn_q.weight", Type: gguf.F16, Dims: []uint64{100, 64}}}, Options{}); got["blk.0.attn_q.weight"] != gguf.F16 {
		t.Errorf("rows of 100 in Q4_K_M: %s, want F16 (Q5_0 does not fit either)", got["blk.0.attn_q.weight"])
	}
	if !NeedsImatrix(IQ2_XS, "blk.0.ffn_up.weight", gguf.IQ2_XS) || NeedsImatrix(MostlyQ2_K, "blk.0.ffn_up.weight", gguf.Q2_K) || NeedsImatrix(MostlyQ2_KS, "token_embd.weight", gguf.Q2_K) {
		t.Error("NeedsImatrix disagrees with llama-quantize")
	}
	if !RequiresImatrix(MostlyQ2_KS) || !RequiresImatrix(IQ2_XS) || RequiresImatrix(IQ3_XXS) || RequiresImatrix(MostlyQ2_K) {
		t.Error("RequiresImatrix disagrees with llama-quantize")
	}
}
