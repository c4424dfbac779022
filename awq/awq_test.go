package awq

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

// familyConfigs cover every family's peculiarity for folding: GQA (o not scaled), MHA (o scaled
// into v), q/k/v biases, q/k norms with an odd head_dim, a sliding window.
var familyConfigs = []struct {
	name, json string
	bias       bool
}{
	{"llama-gqa", `{"model_type": "llama", "hidden_size": 96, "intermediate_size": 160, "num_hidden_layers": 2,
		"num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 301}`, false},
	{"llama-mha", `{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 101}`, false},
	{"qwen2-bias-mha", `{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 157, "tie_word_embeddings": true}`, true},
	{"qwen3-qknorm", `{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 211}`, false},
	{"mistral-window", `{"model_type": "mistral", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
		"num_attention_heads": 8, "num_key_value_heads": 1, "vocab_size": 97, "sliding_window": 5}`, false},
}

func randomModel(t *testing.T, js string, bias bool, r *rand.Rand) *model.Model {
	t.Helper()
	cfg, err := model.ParseConfig([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	w := model.NewMapWeights()
	set := func(name string, scale float64, shape ...int) {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(scale * r.NormFloat64())
		}
		w.Set(name, v, shape...)
	}
	ones := func(name string, n int) {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(0.5 + r.Float64())
		}
		w.Set(name, v, n)
	}
	h, q, kv, hd := cfg.Hidden, cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim, cfg.HeadDim
	set("model.embed_tokens.weight", 1, cfg.Vocab, h)
	ones("model.norm.weight", h)
	if !cfg.TieEmbeddings {
		set("lm_head.weight", 0.1, cfg.Vocab, h)
	}
	for i := range cfg.Layers {
		p := "model.layers." + string(rune('0'+i)) + "."
		ones(p+"input_layernorm.weight", h)
		ones(p+"post_attention_layernorm.weight", h)
		if cfg.QKNorm {
			ones(p+"self_attn.q_norm.weight", hd)
			ones(p+"self_attn.k_norm.weight", hd)
		}
		type linear struct {
			name    string
			out, in int
		}
		linears := []linear{{"self_attn.q_proj", q, h}, {"self_attn.k_proj", kv, h}, {"self_attn.v_proj", kv, h}, {"self_attn.o_proj", h, q},
			{"mlp.gate_proj", cfg.Intermediate, h}, {"mlp.up_proj", cfg.Intermediate, h}, {"mlp.down_proj", h, cfg.Intermediate}}
		if cfg.SparseBlock(i) {
			n, mi, si := cfg.MoENames(i, func(string) bool { return false }), cfg.MoE.Intermediate, cfg.MoE.SharedIntermediate
			linears = append(linears[:4], linear{n.Router, cfg.MoE.Experts, h})
			for e := range cfg.MoE.Experts {
				linears = append(linears, linear{n.Gate[e], mi, h}, linear{n.Up[e], mi, h}, linear{n.Down[e], h, mi})
			}
			if si > 0 {
				linears = append(linears, linear{n.Shared[0], si, h}, linear{n.Shared[1], si, h}, linear{n.Shared[2], h, si}, linear{n.SharedGate, 1, h})
			}
			for j := 4; j < len(linears); j++ {
				linears[j].name = strings.TrimPrefix(linears[j].name, p)
			}
		}
		for _, l := range linears {
			set(p+l.name+".weight", 1/math.Sqrt(float64(l.in)), l.out, l.in)
			if bias && (l.name == "self_attn.q_proj" || l.name == "self_attn.k_proj" || l.name == "self_attn.v_proj") {
				set(p+l.name+".bias", 0.1, l.out)
			}
		}
	}
	m, err := model.Load(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// foldRandomScales folds scales in [1/4, 4] into every pair of every block.
func foldRandomScales(t *testing.T, m *model.Model, r *rand.Rand) (pairs int) {
	for i := range m.Config.Layers {
		b, err := m.Block(i)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range Pairs(b) {
			s := make([]float32, b.Linears(p.Group)[0].In)
			for c := range s {
				s[c] = float32(math.Exp2(4*r.Float64() - 2))
			}
			Fold(b, p, s)
			pairs++
		}
	}
	return pairs
}

func assertLogitsClose(t *testing.T, got, want []float32, tol float64) {
	t.Helper()
	var num, den float64
	for i := range want {
		d := float64(got[i] - want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if rel := math.Sqrt(num / den); !(rel <= tol) {
		t.Errorf("logits changed by folding: relative difference %.3g > %.g", rel, tol)
	}
}

// Folding the scales into a mixture of experts (router, shared expert and every expert's gate/up
// behind the post-attention norm; each expert's down behind its up) leaves its function unchanged.
func TestFoldKeepsLogitsMoE(t *testing.T) {
	js := `{"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 89, "num_experts": 5,
		"num_experts_per_tok": 2, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40}`
	r := rand.New(rand.NewPCG(9, 3))
	m := randomModel(t, js, true, r)
	ids := make([]int, 23)
	for i := range ids {
		ids[i] = r.IntN(m.Config.Vocab)
	}
	want, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	// qkv, o (no GQA), the gate/up of the router, shared expert and 5 experts, 5 downs, the shared down
	if pairs := foldRandomScales(t, m, r); pairs != 2*(3+5+1) {
		t.Errorf("%d pairs scaled, want %d", pairs, 2*(3+5+1))
	}
	got, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	assertLogitsClose(t, got, want, 5e-6)
}

// Folding the scales leaves the unquantized model's function unchanged, for every family.
func TestFoldKeepsLogits(t *testing.T) {
	for _, tc := range familyConfigs {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			m := randomModel(t, tc.json, tc.bias, r)
			ids := make([]int, 29)
			for i := range ids {
				ids[i] = r.IntN(m.Config.Vocab)
			}
			want, err := m.Logits(ids)
			if err != nil {
				t.Fatal(err)
			}
			pairs := foldRandomScales(t, m, r)
			wantPairs := 3 * m.Config.Layers
			if m.Config.KVHeads == m.Config.Heads {
				wantPairs = 4 * m.Config.Layers
			}
			if pairs != wantPairs {
				t.Errorf("%d pairs scaled, want %d (o only without GQA)", pairs, wantPairs)
			}
			got, err := m.Logits(ids)
			if err != nil {
				t.Fatal(err)
			}
			assertLogitsClose(t, got, want, 2e-6)
		})
	}
}

func TestFoldKeepsLogitsTiny(t *testing.T) {
	m, err := model.Open(testenv.Testdata(t, "models/tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids := []int{5, 300, 17, 2000, 44, 9, 1023, 7, 7, 100}
	want, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	foldRandomScales(t, m, rand.New(rand.NewPCG(3, 4)))
	got, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	assertLogitsClose(t, got, want, 2e-6)
}

// A constructed case where AWQ must help: a few input channels carry most of the activation
// magnitude, so protecting their weights (α > 0) lowers the output error of 3-bit RTN.
func TestSearchScaleBeatsRTN(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const rows, k, n = 256, 256, 96
	x := make([]float32, rows*k)
	for i := range x {
		c := i % k
		v := r.NormFloat64()
		if c%37 == 0 {
			v *= 30 // salient channels
		}
		x[i] = float32(v)
	}
	in := &Inputs{}
	if err := in.Add(x, rows, k); err != nil {
		t.Fatal(err)
	}
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	s := quant.Scheme{Bits: 3, GroupSize: 128}
	res, err := SearchScale(in.X, in.Rows, in.MeanAbs(), []Linear{{Name: "l", W: w, Out: n, In: k, Scheme: &s}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Alpha == 0 || !(res.Loss < 0.8*res.Loss0) {
		t.Errorf("α %.2f, loss %.4g vs %.4g at α=0: the search did not protect the salient channels", res.Alpha, res.Loss, res.Loss0)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range res.Scales {
		lo, hi = math.Min(lo, float64(v)), math.Max(hi, float64(v))
	}
	if math.Abs(lo*hi-1) > 1e-4 {
		t.Errorf("scales not normalised by sqrt(max·min): max·min = %g", lo*hi)
	}
	// The chosen loss is what the candidate scale really gives.
	wq, err := fakeQuantScaled(nil, Linear{Name: "l", W: w, Out: n, In: k, Scheme: &s}, res.Scales, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := outputError(x, w, wq, rows, n, k); math.Abs(got-res.Loss) > 1e-3*got {
		t.Errorf("reported loss %.6g, recomputed %.6g", res.Loss, got)
	}
}

// outputError is the mean squared difference of X·Wᵀ and X·Wqᵀ over rows × n outputs.
func outputError(x, w, wq []float32, rows, n, k int) float64 {
	var sum float64
	for tok := range rows {
		for o := range n {
			var a, b float64
			for c := range k {
				a += float64(x[tok*k+c]) * float64(w[o*k+c])
				b += float64(x[tok*k+c]) * float64(wq[o*k+c])
			}
			sum += (a - b) * (a - b)
		}
	}
	return sum / float64(rows*n)
}

// The clipping search never does worse than no clipping, and clamps within each group's range.
func TestSearchClip(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const rows, k, n = 600, 256, 40
	x := make([]float32, rows*k)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(r.NormFloat64() * r.ExpFloat64()) // heavy tails: clipping pays
	}
	orig := append([]float32(nil), w...)
	s := quant.Scheme{Bits: 3, GroupSize: 64}
	res, err := SearchClip(x, rows, Linear{Name: "l", W: w, Out: n, In: k, Scheme: &s}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !(res.Err <= res.Err0) || res.Clipped == 0 {
		t.Errorf("clip error %.4g vs %.4g unclipped, %d groups clipped", res.Err, res.Err0, res.Clipped)
	}
	am := groupAbsMax(orig, n, k, 64)
	for i, v := range w {
		m := am[(i/k)*(k/64)+(i%k)/64]
		if math.Abs(float64(v)) > float64(m) || (v != orig[i] && math.Abs(float64(v)) < 0.55*float64(m)-1e-6) {
			t.Fatalf("weight %d: %g from %g outside the searched range (group max %g)", i, v, orig[i], m)
		}
	}
}

func TestInputsRefuseNaN(t *testing.T) {
	in := &Inputs{}
	x := []float32{1, 2, 3, float32(math.NaN()), 5, 6}
	if err := in.Add(x, 2, 3); err == nil || !strings.Contains(err.Error(), "channel 0") || !strings.Contains(err.Error(), "token 1") {
		t.Errorf("NaN activation: %v", err)
	}
}

func TestInputsStride(t *testing.T) {
	in := &Inputs{Stride: 3}
	x := make([]float32, 10*2)
	for i := range x {
		x[i] = float32(i)
	}
	if err := in.Add(x[:8], 4, 2); err != nil {
		t.Fatal(err)
	}
	if err := in.Add(x[8:], 6, 2); err != nil {
		t.Fatal(err)
	}
	if in.Rows != 4 || in.X[2] != 6 || in.X[6] != 18 || in.Tokens() != 10 {
		t.Errorf("stride 3 over 10 tokens kept %d rows %v", in.Rows, in.X)
	}
	if m := in.MeanAbs(); m[0] != 9 || m[1] != 10 {
		t.Errorf("mean |x| %v", m)
	}
}

// AutoAWQ's w_mean: |w| over its group's absmax, averaged over all rows of the group's linears.
func TestWeightMeanAndDuoCandidate(t *testing.T) {
	s := quant.Scheme{Bits: 4, GroupSize: 2}
	ls := []Linear{
		{Name: "a", W: []float32{1, -2, 4, 0}, Out: 1, In: 4, Scheme: &s},
		{Name: "b", W: []float32{-3, 3, 1, 1}, Out: 1, In: 4, Scheme: &s},
	}
	got := weightMean(ls, 4)
	want := []float32{0.75, 1, 1, 0.5}
	for c := range want {
		if math.Abs(float64(got[c]-want[c])) > 1e-6 {
			t.Fatalf("w_mean %v, want %v", got, want)
		}
	}
	x := []float32{1, 4, 9, 16}
	d := DuoCandidate(x, got, 0.5)
	c := Candidate([]float32{1 / float32(math.Sqrt(0.75)+1e-4), 2 / (1 + 1e-4), 3 / (1 + 1e-4), 4 / float32(math.Sqrt(0.5)+1e-4)}, 1)
	for i := range d {
		if math.Abs(float64(d[i]-c[i])) > 1e-5 {
			t.Fatalf("duo candidate %v, want %v", d, c)
		}
	}
}

// TestOutputLoss: both ways of measuring ‖X·Dᵀ‖² (through the Gram matrix when there are fewer
// channels than rows, directly otherwise) match float64 sums, in total and per row of D.
func TestOutputLoss(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, s := range [][3]int{{300, 37, 5}, {20, 37, 5}, {37, 37, 1}, {512, 128, 70}, {1, 3, 2}} {
		rows, k, n := s[0], s[1], s[2]
		x, d := make([]float32, rows*k), make([]float32, n*k)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		for i := range d {
			d[i] = float32(r.NormFloat64() * 1e-2)
		}
		want := make([]float64, n)
		total := 0.0
		for o := range n {
			for tok := range rows {
				var e float64
				for c := range k {
					e += float64(x[tok*k+c]) * float64(d[o*k+c])
				}
				want[o] += e * e
			}
			total += want[o]
		}
		out := newOutputLoss(x, rows, k)
		if (out.gram != nil) != (k < rows) {
			t.Errorf("rows %d, k %d: Gram matrix used = %v", rows, k, out.gram != nil)
		}
		got := make([]float64, n)
		out.perRow(got, d, n)
		for o := range n {
			if math.Abs(got[o]-want[o]) > 1e-5*want[o] {
				t.Errorf("rows %d, k %d: row %d loss %g, want %g", rows, k, o, got[o], want[o])
			}
		}
		if all := out.of(d, n); math.Abs(all-total) > 1e-5*total {
			t.Errorf("rows %d, k %d: loss %g, want %g", rows, k, all, total)
		}
	}
}

// The search quantizes to IQ types too, fitting them with the importance E[x²]/s² their scaled
// inputs have (iq2_xxs has no fit without importance); its loss must be what that fit gives.
// (On the salient-channel case of TestSearchScaleBeatsRTN that importance already protects the
// salient channels: α = 0 wins.)
func TestSearchScaleIQuant(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const rows, k, n = 128, 256, 32
	x := make([]float32, rows*k)
	for i := range x {
		v := r.NormFloat64()
		if i%k%37 == 0 {
			v *= 30
		}
		x[i] = float32(v)
	}
	in := &Inputs{}
	if err := in.Add(x, rows, k); err != nil {
		t.Fatal(err)
	}
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	s, _ := quant.IQuantScheme(quant.IQ2XXS)
	l := Linear{Name: "l", W: w, Out: n, In: k, Scheme: &s}
	res, err := SearchScale(in.X, in.Rows, in.MeanAbs(), []Linear{l}, Options{Grid: 5})
	if err != nil {
		t.Fatal(err)
	}
	if !(res.Loss <= res.Loss0) {
		t.Errorf("α %.2f, loss %.4g above %.4g at α=0", res.Alpha, res.Loss, res.Loss0)
	}
	wq, err := fakeQuantScaled(nil, l, res.Scales, meanSquares(in.X, in.Rows, k))
	if err != nil {
		t.Fatal(err)
	}
	if got := outputError(x, w, wq, rows, n, k); math.Abs(got-res.Loss) > 1e-3*res.Loss {
		t.Errorf("the chosen loss %g, recomputed %g", res.Loss, got)
	}
}
