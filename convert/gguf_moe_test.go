package convert

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/ftype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/internal/moetest"
	"github.com/qpack-dev/qpack/internal/synth"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quantized"
)

// moeFamilies are the mixtures of experts --format gguf writes, with their llama.cpp architecture.
var moeFamilies = []struct{ family, arch string }{{"mixtral", "llama"}, {"qwen2_moe", "qwen2moe"}, {"qwen3_moe", "qwen3moe"}}

// moeGoldenSources are the mixtures of experts of the llama-quantize fixture: tiny made a
// Mixtral and a Qwen2-MoE (rows of 128 and 384: llama.cpp's fallbacks), and a random Mixtral of
// 8 experts (llama.cpp's 8-expert rules) with rows of 256.
func moeGoldenSources(t *testing.T) map[string]string {
	t.Helper()
	tiny := testenv.Testdata(t, "models/tiny")
	mix8 := filepath.Join(t.TempDir(), "mixtral8")
	cfg := synth.Config{Layers: 8, Hidden: 256, Intermediate: 256, Heads: 4, KVHeads: 2, Vocab: 2048, Experts: 8, ExpertsPerToken: 2, Seed: 3}
	if err := synth.Write(mix8, cfg); err != nil {
		t.Fatal(err)
	}
	copyTinyTokenizer(t, mix8)
	return map[string]string{"mixtral": moetest.FromDense(t, tiny, "mixtral", nil),
		"qwen2_moe": moetest.FromDense(t, tiny, "qwen2_moe", nil), "mixtral8": mix8}
}

// moeSynth is synthLlama made a mixture of experts of family (4 experts, top 2): rows of 256 and
// 512, whole k-quant super-blocks.
func moeSynth(t *testing.T, family string) string {
	t.Helper()
	return moetest.FromDense(t, synthLlama(t), family, nil)
}

// sameAsQPack converts src with the plan opt makes under --format gguf to out, and again to
// --format qpack, and checks that every quantized weight decodes to the same floats from both
// (each expert from its place in its merged tensor) and that the model computes the same
// perplexity from both. token_embd and output are written in F32, as the qpack checkpoint keeps
// them, so that nothing else differs.
func sameAsQPack(t *testing.T, src, out string, opt Options) *Report {
	t.Helper()
	opt.Format, opt.InputHash = "gguf", HashNone
	opt.GGUF.EmbedType, opt.GGUF.OutputType = "f32", "f32"
	plan, err := Plan(src, opt)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Convert(src, out, opt)
	if err != nil {
		t.Fatal(err)
	}
	qopt := opt
	qopt.Format, qopt.GGUF, qopt.Plan, qopt.Alloc = "qpack", GGUFOptions{}, plan, DefaultOptions().Alloc
	qdir := filepath.Join(t.TempDir(), "q")
	if _, err := Convert(src, qdir, qopt); err != nil {
		t.Fatal(err)
	}
	cfg, err := model.LoadConfig(src)
	if err != nil {
		t.Fatal(err)
	}
	g, err := ggufexport.OpenWeights(out, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	q, err := quantized.Open(qdir)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	compared := 0
	for _, e := range plan.Entries {
		if e.Scheme == alloc.KeepName {
			continue
		}
		a, err := g.Float32(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := q.Float32(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) {
			t.Fatalf("%s (%s) decodes differently from the GGUF file and the qpack checkpoint", e.Name, e.Scheme)
		}
		compared++
	}
	if compared == 0 {
		t.Fatal("nothing quantized")
	}
	m, err := model.Load(cfg, g)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := model.Open(qdir)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	if a, b := syntheticPerplexity(t, m), syntheticPerplexity(t, ref); a != b {
		t.Errorf("perplexity %v from the GGUF file, %v from the qpack checkpoint", a, b)
	}
	return r
}

// A preset writes each family's experts merged per projection ([experts, N, K]) in the types
// llama-quantize's rules give the merged tensors, the routers in F32; every weight decodes as
// from the qpack conversion of the same plan.
func TestConvertGGUFMoEPreset(t *testing.T) {
	for _, c := range moeFamilies {
		t.Run(c.family, func(t *testing.T) {
			src := moeSynth(t, c.family)
			out := filepath.Join(t.TempDir(), "m.gguf")
			opt := DefaultOptions()
			opt.GGUF.Preset = "Q4_K_M"
			sameAsQPack(t, src, out, opt)
			want := presetWant(t, src, ftype.MostlyQ4_KM, false)
			want["token_embd.weight"], want["output.weight"] = gguf.F32, gguf.F32
			got, f := ggufTypes(t, out)
			defer f.Close()
			if len(got) != len(want) {
				t.Errorf("%d tensors, llama.cpp's layout has %d", len(got), len(want))
			}
			for name, w := range want {
				if got[name] != w {
					t.Errorf("%s is %s, llama-quantize's rules give %s", name, got[name], w)
				}
			}
			if ti, ok := f.Tensor("blk.2.ffn_down_exps.weight"); !ok || !slices.Equal(ti.Dims, []uint64{512, 256, 4}) || ti.Type != gguf.Q6_K {
				t.Errorf("ffn_down_exps: %+v (the last of 3 blocks uses more bits under Q4_K_M)", ti)
			}
			if ti, ok := f.Tensor("blk.0.ffn_gate_inp.weight"); !ok || ti.Type != gguf.F32 {
				t.Errorf("router: %+v", ti)
			}
			if v, _ := f.Get(c.arch + ".expert_count"); v != uint32(4) {
				t.Errorf("expert_count %v", v)
			}
		})
	}
}

// GPTQ calibrates every expert as convert does for any format; the GGUF file holds the same
// weights as the qpack checkpoint of the plan. The evolved and budget plans tie a merged
// tensor's experts to one type.
func TestConvertGGUFMoEPlans(t *testing.T) {
	calib := CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 4, SeqLen: 64}
	gptq := GPTQ.DefaultOptions()
	gptq.GGUF.Preset, gptq.Calib = "Q3_K_M", calib
	evolved := DefaultOptions()
	evolved.Alloc = alloc.Options{Strategy: alloc.StrategyEvolved, Evolved: &alloc.EvolvedRule{EdgeFraction: 0, Threshold: 0.004}}
	budget := DefaultOptions()
	kquants, err := alloc.ParseLadder("q3_k,q4_k,q5_k,q6_k") // qpack's format fits Q4_0/Q5_0/Q8_0 otherwise than llama.cpp
	if err != nil {
		t.Fatal(err)
	}
	budget.Alloc = alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: 4.5, Ladder: kquants}
	for _, c := range []struct {
		name, family string
		opt          Options
	}{{"gptq", "qwen2_moe", gptq}, {"evolved", "qwen3_moe", evolved}, {"budget", "mixtral", budget}} {
		t.Run(c.name+"/"+c.family, func(t *testing.T) {
			src := moeSynth(t, c.family)
			out := filepath.Join(t.TempDir(), "m.gguf")
			r := sameAsQPack(t, src, out, c.opt)
			if c.opt.Alloc.TargetBPW > 0 && r.QuantBPW > c.opt.Alloc.TargetBPW {
				t.Errorf("%.3f bpw over a %g budget", r.QuantBPW, c.opt.Alloc.TargetBPW)
			}
			experts := 0
			for _, tr := range r.Tensors {
				if strings.Contains(tr.Name, ".experts.") && tr.Scheme != alloc.KeepName {
					experts++
					if len(tr.Outputs) != 1 || !strings.Contains(tr.Outputs[0], "_exps.weight") || !strings.Contains(tr.Outputs[0], "expert ") {
						t.Errorf("%s: outputs %v", tr.Name, tr.Outputs)
					}
				}
			}
			if experts != 3*3*4 {
				t.Errorf("%d experts' weights quantized, want 36", experts)
			}
		})
	}
}

// What llama.cpp's merged tensors cannot hold is refused before anything is written: experts of
// one merged tensor pinned or replayed with different types, and (as `export gguf` does)
// routing llama.cpp's architecture computes otherwise.
func TestConvertGGUFMoERefusals(t *testing.T) {
	src := moeSynth(t, "mixtral")
	pin := DefaultOptions()
	pin.Format = "gguf"
	pin.Alloc = alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: 4.5}
	var err error
	if pin.Alloc.Overrides, err = alloc.ParseOverrides([]string{`layers\.1\.block_sparse_moe\.experts\.2\.w2=q8_0`}); err != nil {
		t.Fatal(err)
	}
	replay := DefaultOptions()
	replay.Format, replay.GGUF.Preset = "gguf", "Q4_K_M"
	plan, err := Plan(src, replay)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range plan.Entries {
		if e.Name == "model.layers.2.block_sparse_moe.experts.3.w1.weight" {
			plan.Entries[i].Scheme = "q8_0"
		}
	}
	replay.GGUF.Preset, replay.Plan = "", plan
	norm := DefaultOptions()
	norm.Format = "gguf"
	for _, c := range []struct {
		name, src string
		opt       Options
		want      []string
	}{
		{"one expert pinned", src, pin, []string{"experts.2.w2.weight", "experts.0.w2.weight", "tied (blk.1.ffn_down_exps.weight"}},
		{"one expert replayed", src, replay, []string{"blk.2.ffn_gate_exps.weight", "expert 3", "q8_0", "one type"}},
		{"norm_topk_prob", moetest.FromDense(t, synthLlama(t), "qwen3_moe", func(c map[string]any) { c["norm_topk_prob"] = false }), norm,
			[]string{"norm_topk_prob is false"}},
	} {
		out := filepath.Join(t.TempDir(), "x.gguf")
		_, err := Convert(c.src, out, c.opt)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v, want one mentioning %q", c.name, err, w)
				break
			}
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s: left a file", c.name)
		}
	}
}

// Presets give every tensor of a mixture of experts the bytes llama-quantize writes (llama.cpp
// c392e509 on F32 GGUF exports of the same weights; testdata/llama-quantize-moe.json holds the
// first 16 hex digits of each tensor's SHA-256): each merged expert tensor, the routers,
// Qwen2-MoE's shared expert, llama.cpp's fallbacks on tiny's rows and its 8-expert rules.
func TestConvertGGUFMoEMatchesLlamaQuantize(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "llama-quantize-moe.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]map[string]string
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	sources := moeGoldenSources(t)
	for key, hashes := range want {
		name, preset, _ := strings.Cut(key, "/")
		opt := DefaultOptions()
		opt.Format, opt.GGUF.Preset, opt.InputHash = "gguf", preset, HashNone
		out := filepath.Join(t.TempDir(), "m.gguf")
		if _, err := Convert(sources[name], out, opt); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		got := tensorHashes(t, out)
		if len(got) != len(hashes) {
			t.Errorf("%s: %d tensors, llama-quantize wrote %d", key, len(got), len(hashes))
		}
		for tensor, h := range hashes {
			if got[tensor] != h {
				t.Errorf("%s: %s differs from llama-quantize's", key, tensor)
			}
		}
	}
}
