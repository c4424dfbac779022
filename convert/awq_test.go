package convert

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/dataset"
	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

func awqOptions(t *testing.T, method Method, s quant.Scheme) Options {
	opt := DefaultOptions()
	opt.Method = method
	opt.Alloc = Uniform(s)
	opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 16, SeqLen: 128}
	return opt
}

// tinyPerplexity scores a converted tiny model on held-out sequences past the calibration text.
func tinyPerplexity(t *testing.T, dir string) float64 {
	t.Helper()
	tiny := testenv.Testdata(t, "models/tiny")
	ids, err := dataset.LoadIDs(filepath.Join(tiny, "heldout_ids.npy"), tiny)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := model.Perplexity(m, ids[len(ids)-12*512:], 512, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r.Perplexity
}

// AWQ through the whole pipeline on tiny at 3 bits: every linear quantized, the norms written
// with the folded scales, and a held-out perplexity below RTN's; awq+gptq too.
func TestAWQConvertTiny(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	dir := t.TempDir()
	s := quant.Scheme{Bits: 3, GroupSize: 128}
	rtn := DefaultOptions()
	rtn.Alloc = Uniform(s)
	if _, err := Convert(tiny, filepath.Join(dir, "rtn"), rtn); err != nil {
		t.Fatal(err)
	}
	pRTN := tinyPerplexity(t, filepath.Join(dir, "rtn"))
	for _, method := range []Method{AWQ, AWQGPTQ} {
		out := filepath.Join(dir, method.String())
		r, err := Convert(tiny, out, awqOptions(t, method, s))
		if err != nil {
			t.Fatal(err)
		}
		if r.Quantized != 28 || r.Method != method.String() {
			t.Fatalf("report %d quantized, method %s", r.Quantized, r.Method)
		}
		in, _ := safetensors.Open(tiny)
		o, _ := safetensors.Open(out)
		a, _ := in.Float32("model.layers.1.input_layernorm.weight")
		b, _ := o.Float32("model.layers.1.input_layernorm.weight")
		in.Close()
		o.Close()
		if len(a) != len(b) || a[0] == b[0] && a[1] == b[1] && a[2] == b[2] {
			t.Errorf("%s: input_layernorm written unchanged: the scales were not folded", method)
		}
		p := tinyPerplexity(t, out)
		t.Logf("%s: perplexity %.3f, RTN %.3f", method, p, pRTN)
		if !(p < pRTN) {
			t.Errorf("%s perplexity %.3f not below RTN's %.3f", method, p, pRTN)
		}
	}
}

// The AWQ GEMM layout as docs/reference/formats.md §2.1 describes it, decoded here independently of package
// packing: qweight [K, N/8] packed along N with ORDER = [0,2,4,6,1,3,5,7], zeros as is, F16
// scales [K/G, N]; W[n,k] = (q − z)·scale must equal the engine's reading of the file.
func TestAWQLayoutDecodesIndependently(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	out := filepath.Join(t.TempDir(), "awq")
	opt := awqOptions(t, "awq", quant.Scheme{Bits: 4, GroupSize: 128})
	opt.Format = "awq"
	opt.Calib.Samples = 4
	if _, err := Convert(tiny, out, opt); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Q map[string]any `json:"quantization_config"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Q["quant_method"] != "awq" || cfg.Q["zero_point"] != true || cfg.Q["bits"] != 4.0 || cfg.Q["group_size"] != 128.0 || !strings.EqualFold(cfg.Q["version"].(string), "gemm") {
		t.Errorf("quantization_config %v", cfg.Q)
	}
	ck, err := safetensors.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	m, err := model.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b, err := m.Block(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*model.Linear{b.Down, b.K, b.Gate} {
		n, k, g := l.Out, l.In, 128
		word := func(name string, i int) uint32 {
			data, err := ck.Bytes(l.Name + "." + name)
			if err != nil {
				t.Fatal(err)
			}
			return binary.LittleEndian.Uint32(data[4*i:])
		}
		scales, err := ck.Bytes(l.Name + ".scales")
		if err != nil {
			t.Fatal(err)
		}
		order := [8]int{0, 2, 4, 6, 1, 3, 5, 7}
		nibble := func(w uint32, col int) float32 { // the nibble holding column col%8
			for i, c := range order {
				if c == col%8 {
					return float32((w >> (4 * i)) & 15)
				}
			}
			panic("unreachable")
		}
		for kk := range k {
			for nn := range n {
				q := nibble(word("qweight", kk*n/8+nn/8), nn)
				z := nibble(word("qzeros", (kk/g)*n/8+nn/8), nn)
				sc := fp.F16ToF32(binary.LittleEndian.Uint16(scales[2*((kk/g)*n+nn):]))
				want := (q - z) * sc
				if got := l.W[nn*k+kk]; math.Abs(float64(got-want)) > 1e-6*math.Abs(float64(want))+1e-12 {
					t.Fatalf("%s [%d,%d]: engine reads %g, the layout decodes %g", l.Name, nn, kk, got, want)
				}
			}
		}
	}
}

// copyTiny writes a copy of the tiny model with its config edited and a tensor replaced.
func copyTiny(t *testing.T, editConfig func(map[string]any), tensor string, edit func([]float32)) string {
	tiny := testenv.Testdata(t, "models/tiny")
	dir := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(tiny, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	if editConfig != nil {
		editConfig(cfg)
	}
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, _ := os.ReadFile(filepath.Join(tiny, "tokenizer.json"))
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.Open(tiny)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var ts []safetensors.WriterTensor
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		data, _ := ck.Bytes(name)
		if name == tensor {
			v, _ := ck.Float32(name)
			edit(v)
			data = encodeFloats(v, info.DType)
		}
		ts = append(ts, safetensors.BytesTensor(name, info.DType, info.Shape, data))
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestAWQRefusals(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	s := quant.Scheme{Bits: 4, GroupSize: 128}
	check := func(what, src string, opt Options, want ...string) {
		t.Helper()
		dst := filepath.Join(t.TempDir(), "out")
		_, err := Convert(src, dst, opt)
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %v, want it to say %q", what, err, w)
			}
		}
		if _, statErr := os.Stat(dst); statErr == nil {
			t.Errorf("%s: output written", what)
		}
	}
	opt := awqOptions(t, "awq", s)
	opt.Calib.File = ""
	check("no calibration", tiny, opt, "--method awq needs calibration data")

	opt = awqOptions(t, "awq", quant.Scheme{Bits: 4, GroupSize: 64, Grid: quant.NF4, Sym: true})
	opt.Format = "qpack"
	check("nf4", tiny, opt, "awq quantizes to integer grids, not nf4-g64")

	// Finite weights whose activations overflow.
	nan := copyTiny(t, nil, "model.layers.0.input_layernorm.weight", func(v []float32) {
		for i := range v {
			v[i] = 3e38
		}
	})
	check("NaN activations", nan, awqOptions(t, "awq", s), "block 0", "input of q_proj, k_proj, v_proj", "non-finite activation")

	mixtral := copyTiny(t, func(c map[string]any) {
		c["model_type"], c["architectures"] = "mixtral", []string{"MixtralForCausalLM"}
	}, "", nil)
	check("mixtral", mixtral, awqOptions(t, "awq", s), "mixtral")
}

// small-llama int4-g128-asym with AWQ and awq+gptq at the README's setting (128 × 512 tokens of
// calib.txt): held-out perplexity at most the floors, 8.90 (RTN 8.950; measured 8.894 on
// the 2-core machine) and 8.82 (GPTQ 8.831; measured 8.776). Minutes on 2 cores: only with
// QPACK_EVAL=1.
func TestSmallLlamaAWQPerplexity(t *testing.T) {
	if os.Getenv("QPACK_EVAL") != "1" || testing.Short() {
		t.Skip("QPACK_EVAL=1 runs the small-llama AWQ conversions and evaluations")
	}
	src := testenv.Shared(t, "models/small-llama")
	ids, err := dataset.LoadIDs(filepath.Join(src, "heldout_ids.npy"), src)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method Method
		floor  float64
	}{
		{AWQ, 8.90},     // issue 12; RTN 8.950
		{AWQGPTQ, 8.82}, // issue 12; GPTQ 8.831
	} {
		opt := c.method.DefaultOptions() // awq+gptq: the imatrix search on
		opt.Format = "qpack"
		opt.Alloc = Uniform(quant.Scheme{Bits: 4, GroupSize: 128})
		opt.Calib = CalibOptions{File: testenv.Shared(t, "models/calib.txt")}
		out := filepath.Join(t.TempDir(), "q")
		if _, err := Convert(src, out, opt); err != nil {
			t.Fatal(err)
		}
		m, err := model.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		r, err := model.Perplexity(m, ids, 512, 64)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("small-llama %s int4-g128-asym: perplexity %.4f", c.method, r.Perplexity)
		if r.Perplexity > c.floor {
			t.Errorf("%s: perplexity %.4f above the floor %.2f", c.method, r.Perplexity, c.floor)
		}
	}
}

// The budget strategy with AWQ: sensitivity is measured on the AWQ-scaled weights (so it differs
// from RTN's), and a plan that keeps some linears in 16 bits converts, those linears written
// with the folded scales.
func TestAWQBudget(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	budget := alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: 6,
		Ladder: []alloc.Choice{alloc.SchemeChoice(quant.Scheme{Bits: 2, GroupSize: 128}), alloc.SchemeChoice(quant.Scheme{Bits: 4, GroupSize: 128}), alloc.Keep}}
	plans := map[Method]*alloc.Plan{}
	for _, method := range []Method{GPTQ, AWQ} {
		opt := awqOptions(t, method, quant.Scheme{})
		opt.Alloc, opt.Format = budget, "qpack"
		p, err := Plan(tiny, opt)
		if err != nil {
			t.Fatal(err)
		}
		plans[method] = p
	}
	var kept []string
	differ := 0
	for i, e := range plans[AWQ].Entries {
		if e.Sensitivity["int4-g128-asym"] != plans[GPTQ].Entries[i].Sensitivity["int4-g128-asym"] {
			differ++
		}
		if e.Scheme == "keep" && strings.HasSuffix(e.Name, "_proj.weight") {
			kept = append(kept, e.Name)
		}
	}
	if differ == 0 {
		t.Error("AWQ's sensitivities equal RTN's: not measured on the scaled weights")
	}
	if len(kept) == 0 {
		t.Fatal("the budget kept no linear in 16 bits; raise the target")
	}
	opt := awqOptions(t, "awq", quant.Scheme{})
	opt.Format, opt.Plan = "qpack", plans[AWQ]
	out := filepath.Join(t.TempDir(), "awq")
	if _, err := Convert(tiny, out, opt); err != nil {
		t.Fatal(err)
	}
	in, _ := safetensors.Open(tiny)
	defer in.Close()
	o, _ := safetensors.Open(out)
	defer o.Close()
	changed := 0
	for _, name := range kept {
		a, _ := in.Float32(name)
		b, err := o.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) {
			changed++
		}
	}
	if changed == 0 {
		t.Errorf("none of the %d kept linears was written with its folded scale", len(kept))
	}
	if p := tinyPerplexity(t, out); math.IsNaN(p) || p > 80 {
		t.Errorf("budget AWQ model perplexity %.2f", p)
	}
}
