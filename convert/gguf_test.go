package convert

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/ftype"
	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/internal/synth"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

// synthLlama writes a small random Llama whose rows are 256 and 512 wide (whole k-quant
// super-blocks), with tiny's tokenizer.
func synthLlama(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "synth")
	if err := synth.Write(dir, synth.Config{Layers: 3, Hidden: 256, Intermediate: 512, Heads: 4, KVHeads: 2, Vocab: 2048, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	copyTinyTokenizer(t, dir)
	return dir
}

// copyTinyTokenizer gives a synthetic checkpoint tiny's tokenizer, which GGUF files carry.
func copyTinyTokenizer(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(testenv.Testdata(t, "models/tiny/tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ggufTypes reads a GGUF file's tensor types by name.
func ggufTypes(t *testing.T, path string) (map[string]gguf.Type, *gguf.File) {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]gguf.Type{}
	for _, ti := range f.Tensors {
		types[ti.Name] = ti.Type
	}
	return types, f
}

// presetChoices are llama-quantize's type choices for the checkpoint at src (ftype.Choose over
// the export's tensors).
func presetChoices(t *testing.T, src string, ft ftype.FileType, imatrix bool) []ftype.Choice {
	t.Helper()
	f32 := filepath.Join(t.TempDir(), "f.gguf")
	if _, err := ggufexport.Export(src, f32, ggufexport.Options{Type: "f16", EmbedType: "f16"}); err != nil {
		t.Fatal(err)
	}
	_, f := ggufTypes(t, f32)
	defer f.Close()
	cfg, err := model.LoadConfig(src)
	if err != nil {
		t.Fatal(err)
	}
	var tensors []ftype.Tensor
	for _, ti := range f.Tensors {
		tensors = append(tensors, ftype.Tensor{Name: ti.Name, Type: ti.Type, Dims: ti.Dims})
	}
	arch, _ := f.Get("general.architecture")
	experts, _ := f.Get(arch.(string) + ".expert_count")
	n, _ := experts.(uint32)
	m := ftype.Model{Arch: arch.(string), Layers: cfg.Layers, Heads: cfg.Heads, KVHeads: cfg.KVHeads, Experts: int(n)}
	choices, err := ftype.Choose(ft, m, tensors, ftype.Options{Imatrix: imatrix})
	if err != nil {
		t.Fatal(err)
	}
	return choices
}

// presetWant is what llama-quantize would write for the checkpoint at src, with the stand-ins
// qpack writes for types it lacks.
func presetWant(t *testing.T, src string, ft ftype.FileType, imatrix bool) map[string]gguf.Type {
	t.Helper()
	want := map[string]gguf.Type{}
	for _, c := range presetChoices(t, src, ft, imatrix) {
		want[c.Name] = c.Type
		if s, ok := standIns[c.Type]; ok && strings.HasPrefix(c.Name, "blk.") {
			want[c.Name] = s
		}
	}
	return want
}

// standInTensors are the decoder tensors llama-quantize gives a type qpack writes a stand-in
// for, with that type.
func standInTensors(t *testing.T, src string, ft ftype.FileType, imatrix bool) map[string]gguf.Type {
	t.Helper()
	out := map[string]gguf.Type{}
	for _, c := range presetChoices(t, src, ft, imatrix) {
		if _, ok := standIns[c.Type]; ok && strings.HasPrefix(c.Name, "blk.") {
			out[c.Name] = c.Type
		}
	}
	return out
}

// A preset gives every tensor llama-quantize's type, on a model with whole super-blocks and
// on tiny, whose 128- and 384-wide rows take llama.cpp's fallbacks; the files load as models
// whose perplexity is close to the source's, and carry their provenance.
func TestConvertGGUFPreset(t *testing.T) {
	for _, c := range []struct {
		src    string
		preset string
	}{{synthLlama(t), "Q4_K_M"}, {synthLlama(t), "Q3_K_S"}, {synthLlama(t), "IQ4_XS"}, {synthLlama(t), "IQ3_S"},
		{testenv.Testdata(t, "models/tiny"), "Q4_K_M"}, {testenv.Testdata(t, "models/tiny"), "Q5_K_S"}, {testenv.Testdata(t, "models/tiny"), "IQ4_NL"}} {
		out := filepath.Join(t.TempDir(), "m.gguf")
		opt := DefaultOptions()
		opt.Format, opt.GGUF.Preset = "gguf", c.preset
		r, err := Convert(c.src, out, opt)
		if err != nil {
			t.Fatalf("%s %s: %v", c.src, c.preset, err)
		}
		ft, _ := ftype.Parse(c.preset)
		want := presetWant(t, c.src, ft, false)
		got, f := ggufTypes(t, out)
		for name, w := range want {
			if got[name] != w {
				t.Errorf("%s %s: %s is %s, llama-quantize's rules give %s", filepath.Base(c.src), c.preset, name, got[name], w)
			}
		}
		if v, _ := f.Get("general.file_type"); v != uint32(ft) {
			t.Errorf("general.file_type %v, want %d", v, ft)
		}
		v, _ := f.Get(ProvenanceKey)
		var prov Provenance
		if err := json.Unmarshal([]byte(v.(string)), &prov); err != nil || len(prov.Inputs) == 0 || strings.Contains(prov.Inputs[0].BLAKE3, "pending") || prov.Format != "gguf" {
			t.Errorf("provenance %v: %+v", err, prov)
		}
		f.Close()
		if r.Files[0] != out || r.Quantized == 0 {
			t.Errorf("report: files %v, %d quantized", r.Files, r.Quantized)
		}
		checkLoads(t, out, c.src)
	}
}

// checkLoads evaluates a GGUF file through qpack's reader: its perplexity on two held-out
// sequences must be within 20% of the source's (a wrong layout gives hundreds).
func checkLoads(t *testing.T, path, src string) {
	t.Helper()
	m, err := ggufexport.OpenModel(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ref, err := model.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	a, b := syntheticPerplexity(t, m), syntheticPerplexity(t, ref)
	if math.IsNaN(a) || math.Abs(a/b-1) > 0.2 {
		t.Errorf("%s: perplexity %v, source %v", filepath.Base(path), a, b)
	}
}

// syntheticPerplexity is a model's perplexity on two sequences of 128 token ids spread over a
// vocabulary of 2048.
func syntheticPerplexity(t *testing.T, m *model.Model) float64 {
	t.Helper()
	ids := make([]int, 2*128)
	for i := range ids {
		ids[i] = (i * 7919) % 2048
	}
	r, err := model.Perplexity(m, ids, 128, 2)
	if err != nil {
		t.Fatal(err)
	}
	return r.Perplexity
}

// Budget plans under --format gguf choose among ggml types only, never a k-quant for rows
// that are not whole super-blocks, and stay within the budget; token_embd and output take the
// requested types.
func TestConvertGGUFBudget(t *testing.T) {
	for _, src := range []string{synthLlama(t), testenv.Testdata(t, "models/tiny")} {
		out := filepath.Join(t.TempDir(), "b.gguf")
		opt := DefaultOptions()
		opt.Format = "gguf"
		opt.Alloc = alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: 4.8}
		opt.GGUF.EmbedType, opt.GGUF.OutputType = "q8_0", "f16"
		r, err := Convert(src, out, opt)
		if err != nil {
			t.Fatal(err)
		}
		if r.QuantBPW > 4.8 {
			t.Errorf("%s: %.3f bpw over a 4.8 budget", src, r.QuantBPW)
		}
		got, f := ggufTypes(t, out)
		for _, ti := range f.Tensors {
			typ := got[ti.Name]
			switch {
			case ti.Name == "token_embd.weight" && typ != gguf.Q8_0, ti.Name == "output.weight" && typ != gguf.F16:
				t.Errorf("%s is %s", ti.Name, typ)
			case strings.HasSuffix(ti.Name, "_norm.weight") && typ != gguf.F32:
				t.Errorf("%s is %s, want F32", ti.Name, typ)
			case strings.HasPrefix(ti.Name, "blk.") && !strings.HasSuffix(ti.Name, "_norm.weight"):
				if _, ok := ggmltype.SchemeOf(typ); !ok || ggmltype.Fits(typ, int(ti.Dims[0])) != nil {
					t.Errorf("%s: %s on rows of %d", ti.Name, typ, ti.Dims[0])
				}
			}
		}
		f.Close()
		checkLoads(t, out, src)
	}
}

// GPTQ writes a preset's k-quants and IQ types too (IQ2_XS needs the importance GPTQ's
// calibration gives); the files load and their types are the preset's.
func TestConvertGGUFGPTQ(t *testing.T) {
	src := synthLlama(t)
	for _, c := range []struct {
		preset string
		ft     ftype.FileType
	}{{"Q3_K_M", ftype.MostlyQ3_KM}, {"IQ2_XS", ftype.IQ2_XS}} {
		out := filepath.Join(t.TempDir(), "g.gguf")
		opt := GPTQ.DefaultOptions()
		opt.Format, opt.GGUF.Preset = "gguf", c.preset
		opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 8, SeqLen: 64}
		if _, err := Convert(src, out, opt); err != nil {
			t.Fatal(err)
		}
		want := presetWant(t, src, c.ft, true)
		got, f := ggufTypes(t, out)
		f.Close()
		for name, w := range want {
			if got[name] != w {
				t.Errorf("%s: %s is %s, llama-quantize's rules give %s", c.preset, name, got[name], w)
			}
		}
		checkLoads(t, out, src)
	}
}

// The budget ladder under --format gguf holds every ggml type the method can fit: the IQ types
// ggml refuses without an importance matrix only with one (round-to-nearest with --imatrix, or
// GPTQ).
func TestGGUFLadderIQ(t *testing.T) {
	needImatrix := []gguf.Type{gguf.IQ1_S, gguf.IQ2_XXS, gguf.IQ2_XS}
	for _, c := range []struct {
		name    string
		opt     Options
		without bool // the ladder lacks needImatrix
	}{
		{"rtn", DefaultOptions(), true},
		{"rtn --imatrix", func() Options { o := DefaultOptions(); o.Imatrix = true; return o }(), false},
		{"gptq", GPTQ.DefaultOptions(), false},
		{"awq+gptq", AWQGPTQ.DefaultOptions(), false},
	} {
		c.opt.Format = "gguf"
		c.opt.Alloc = alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: 3}
		types := map[gguf.Type]bool{}
		for _, ch := range c.opt.ggufLadder() {
			typ, ok := ggmltype.TypeOf(ch.Scheme)
			if !ok {
				t.Fatalf("%s: %s on the ladder is no ggml type", c.name, ch.Scheme)
			}
			types[typ] = true
		}
		for _, typ := range []gguf.Type{gguf.IQ1_M, gguf.IQ2_S, gguf.IQ3_XXS, gguf.IQ3_S, gguf.IQ4_XS, gguf.IQ4_NL, gguf.Q8_0} {
			if !types[typ] {
				t.Errorf("%s: the ladder lacks %s", c.name, typ)
			}
		}
		for _, typ := range needImatrix {
			if types[typ] == c.without {
				t.Errorf("%s: %s on the ladder is %v", c.name, typ, types[typ])
			}
		}
	}
}

// A budget below Q2_K's 2.625 bits per weight is met with IQ types; round-to-nearest without
// an importance matrix never picks those ggml refuses without one.
func TestConvertGGUFBudgetIQ(t *testing.T) {
	src := synthLlama(t)
	for _, imatrix := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "b.gguf")
		opt := DefaultOptions()
		opt.Format, opt.Imatrix = "gguf", imatrix
		opt.Alloc = alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: 2.4}
		opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 8, SeqLen: 64}
		r, err := Convert(src, out, opt)
		if err != nil {
			t.Fatalf("imatrix %v: %v", imatrix, err)
		}
		if r.QuantBPW > 2.4 {
			t.Errorf("imatrix %v: %.3f bpw over a 2.4 budget", imatrix, r.QuantBPW)
		}
		got, f := ggufTypes(t, out)
		f.Close()
		lattice := 0
		for name, typ := range got {
			if !strings.HasPrefix(name, "blk.") || typ == gguf.F32 {
				continue
			}
			if s, ok := ggmltype.SchemeOf(typ); ok && s.Grid == quant.IQuant {
				lattice++
			}
			if !imatrix && (typ == gguf.IQ1_S || typ == gguf.IQ2_XXS || typ == gguf.IQ2_XS) {
				t.Errorf("round-to-nearest without an imatrix wrote %s in %s", name, typ)
			}
		}
		if lattice == 0 {
			t.Errorf("imatrix %v: no IQ type under 2.4 bits per weight: %v", imatrix, got)
		}
		checkLoads(t, out, src)
	}
}

// Bad GGUF settings are refused before anything is read, naming what is wrong.
func TestConvertGGUFRefusals(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	int4, _ := ggmltype.SchemeOf(gguf.Q4_K)
	q4k := alloc.SchemeChoice(int4)
	cases := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"preset with a budget", func(o *Options) {
			o.GGUF.Preset, o.Alloc.Strategy, o.Alloc.TargetBPW = "Q4_K_M", alloc.StrategyBudget, 4
		}, "takes no"},
		{"unknown preset", func(o *Options) { o.GGUF.Preset = "Q4_K_X" }, "Q4_K_M"},
		{"preset of a float type", func(o *Options) { o.GGUF.Preset = "F16" }, "export gguf"},
		{"embed type", func(o *Options) { o.GGUF.EmbedType = "tq1_0" }, "--embed-type"},
		{"not a ggml scheme", func(o *Options) { o.Alloc = Uniform(DefaultScheme) }, "ggml types"},
		{"embeddings by the plan", func(o *Options) {
			o.Alloc = alloc.Options{Strategy: alloc.StrategyUniform, Ladder: []alloc.Choice{q4k}, QuantizeEmbeddings: true}
		}, "--embed-type"},
		{"Q2_K_S without an imatrix", func(o *Options) { o.GGUF.Preset = "Q2_K_S" }, "importance matrix"},
		{"gguf options elsewhere", func(o *Options) { o.Format, o.GGUF.Preset = "qpack", "Q4_K_M" }, "--format gguf"},
	}
	for _, c := range cases {
		opt := DefaultOptions()
		opt.Format = "gguf"
		c.edit(&opt)
		out := filepath.Join(t.TempDir(), "x.gguf")
		_, err := Convert(tiny, out, opt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.want)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s: left a file", c.name)
		}
	}
	// A replayed plan with a k-quant on rows that are not whole super-blocks names the tensor.
	opt := DefaultOptions()
	opt.Format, opt.GGUF.Preset = "gguf", "Q8_0"
	plan, err := Plan(tiny, opt)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range plan.Entries {
		if strings.HasSuffix(e.Name, "q_proj.weight") {
			plan.Entries[i].Scheme = "q4_k"
		}
	}
	replay := DefaultOptions()
	replay.Format, replay.Plan = "gguf", plan
	if _, err := Convert(tiny, filepath.Join(t.TempDir(), "r.gguf"), replay); err == nil || !strings.Contains(err.Error(), "q_proj.weight") {
		t.Errorf("replayed q4_k on rows of 128: %v", err)
	}
}
