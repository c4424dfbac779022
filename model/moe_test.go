package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
)

// moeTestConfigs cover each family's peculiarities: Mixtral's layout and sliding window,
// Qwen3-MoE's q/k norms, normalized top-k weights and dense blocks (mlp_only_layers,
// decoder_sparse_step), Qwen2-MoE's shared expert with its sigmoid gate and q/k/v biases.
var moeTestConfigs = []struct {
	name, json string
	bias       bool
}{
	{"mixtral", `{"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97, "num_local_experts": 4,
		"num_experts_per_tok": 2, "sliding_window": 7}`, false},
	{"qwen3_moe", `{"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 4,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 113, "num_experts": 6,
		"num_experts_per_tok": 3, "moe_intermediate_size": 32, "norm_topk_prob": true, "decoder_sparse_step": 1,
		"mlp_only_layers": [2]}`, false},
	{"qwen2_moe", `{"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 89, "num_experts": 5,
		"num_experts_per_tok": 2, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40,
		"tie_word_embeddings": true}`, true},
}

// randomExperts adds block i's router and experts (and shared expert) in the layout of
// cfg's family.
func randomExperts(cfg *Config, i int, set func(name string, shape ...int)) {
	h, c := cfg.Hidden, cfg.MoE
	mixtral := cfg.ModelType == "mixtral"
	n := cfg.MoENames(i, func(string) bool { return mixtral })
	set(n.Router+".weight", c.Experts, h)
	for e := range c.Experts {
		set(n.Gate[e]+".weight", c.Intermediate, h)
		set(n.Up[e]+".weight", c.Intermediate, h)
		set(n.Down[e]+".weight", h, c.Intermediate)
	}
	if c.SharedIntermediate > 0 {
		set(n.Shared[0]+".weight", c.SharedIntermediate, h)
		set(n.Shared[1]+".weight", c.SharedIntermediate, h)
		set(n.Shared[2]+".weight", h, c.SharedIntermediate)
		set(n.SharedGate+".weight", 1, h)
	}
}

func TestParseConfigMoE(t *testing.T) {
	c := mustConfig(t, moeTestConfigs[1].json)
	want := MoEConfig{Experts: 6, TopK: 3, Intermediate: 32, NormTopK: true, Sparse: []bool{true, true, false, true}}
	if !c.QKNorm || !slices.Equal(c.MoE.Sparse, want.Sparse) || c.MoE.Experts != 6 || c.MoE.TopK != 3 ||
		c.MoE.Intermediate != 32 || !c.MoE.NormTopK || c.MoE.SharedIntermediate != 0 || c.Intermediate != 80 {
		t.Errorf("qwen3_moe: %+v, want %+v", c.MoE, want)
	}
	c = mustConfig(t, moeTestConfigs[0].json)
	if c.MoE.Intermediate != 48 || !c.MoE.NormTopK || !slices.Equal(c.SlidingWindow, []int{7, 7}) || c.QKNorm {
		t.Errorf("mixtral: %+v, windows %v", c.MoE, c.SlidingWindow)
	}
	c = mustConfig(t, moeTestConfigs[2].json)
	if c.MoE.SharedIntermediate != 40 || c.MoE.NormTopK || c.MoE.Experts != 5 {
		t.Errorf("qwen2_moe: %+v", c.MoE)
	}
	// decoder_sparse_step 2: blocks 1 and 3 have experts; num_local_experts as Qwen3-MoE
	// checkpoints of transformers 5 name it.
	c = mustConfig(t, `{"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 4,
		"num_attention_heads": 4, "vocab_size": 50, "num_local_experts": 4, "num_experts_per_tok": 1,
		"moe_intermediate_size": 16, "decoder_sparse_step": 2}`)
	if !slices.Equal(c.MoE.Sparse, []bool{false, true, false, true}) || c.MoE.Experts != 4 {
		t.Errorf("decoder_sparse_step 2: %+v", c.MoE)
	}
	dense := mustConfig(t, `{"model_type": "llama", "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2,
		"num_attention_heads": 4, "vocab_size": 50, "num_experts": 8}`)
	if dense.IsMoE() || dense.SparseBlock(0) {
		t.Errorf("a llama config with num_experts became a mixture of experts: %+v", dense.MoE)
	}
}

func TestParseConfigMoEErrors(t *testing.T) {
	base := `"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 50`
	cases := map[string]string{
		`{"model_type": "mixtral", ` + base + `, "num_experts_per_tok": 2}`:                                                                           "num_local_experts",
		`{"model_type": "mixtral", ` + base + `, "num_local_experts": 2, "num_experts_per_tok": 3}`:                                                   "num_experts_per_tok 3",
		`{"model_type": "qwen3_moe", ` + base + `, "num_experts": 4, "num_experts_per_tok": 2}`:                                                       "moe_intermediate_size",
		`{"model_type": "qwen3_moe", ` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "mlp_only_layers": [3]}`:   "mlp_only_layers",
		`{"model_type": "qwen2_moe", ` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "decoder_sparse_step": 0}`: "decoder_sparse_step",
		`{"model_type": "deepseek_v3", ` + base + `}`:                                                                                                 "qwen3_moe (Qwen3MoeForCausalLM)",
	}
	for in, want := range cases {
		_, err := ParseConfig([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one mentioning %q", in, err, want)
		}
	}
}

func TestRoute(t *testing.T) {
	// Token 0: experts 2 and 0 tie for second place behind 1: the lower index wins.
	// Token 1: a clear order 3 > 0 > 1.
	logits := []float32{1, 2, 1, 0, 0.5, 0, -1, 3}
	r := route(logits, 2, 4, 2, false)
	if !slices.Equal(r.Expert, []int{0, 1, 0, 3}) {
		t.Fatalf("experts %v, want [0 1 0 3]", r.Expert)
	}
	p0 := softmaxF64([]float64{1, 2, 1, 0})
	p1 := softmaxF64([]float64{0.5, 0, -1, 3})
	want := []float64{p0[0], p0[1], p1[0], p1[3]}
	for i, w := range want {
		if math.Abs(float64(r.Weight[i])-w) > 1e-7 {
			t.Errorf("weight %d: %v, want %v", i, r.Weight[i], w)
		}
	}
	n := route(logits, 2, 4, 2, true)
	for tok := range 2 {
		s := n.Weight[2*tok] + n.Weight[2*tok+1]
		if math.Abs(float64(s)-1) > 1e-6 || math.Abs(float64(n.Weight[2*tok]/n.Weight[2*tok+1]-r.Weight[2*tok]/r.Weight[2*tok+1])) > 1e-6 {
			t.Errorf("token %d: normalized weights %v", tok, n.Weight[2*tok:2*tok+2])
		}
	}
	p := route(logits, 2, 4, 2, true).plan(4, true)
	// Rows by expert: expert 0 has tokens 0 and 1, expert 1 token 0, expert 3 token 1.
	if !slices.Equal(p.start, []int{0, 2, 3, 3, 4}) || !slices.Equal(p.token, []int32{0, 1, 0, 1}) ||
		!slices.Equal(p.pos, []int32{0, 2, 4, 1, 3, 5}) || p.slots != 3 {
		t.Errorf("plan %+v", p)
	}
}

func softmaxF64(x []float64) []float64 {
	mx := slices.Max(x)
	p := make([]float64, len(x))
	var s float64
	for i, v := range x {
		p[i] = math.Exp(v - mx)
		s += p[i]
	}
	for i := range p {
		p[i] /= s
	}
	return p
}

// naiveMoE is the mixture of experts of transformers' modeling code, token by token in float64:
// softmax over the router's logits, the top k (sorted by probability, stable), optionally
// renormalized, each expert's MLP weighted, plus the sigmoid-gated shared expert.
func naiveMoE(h []float32, T int, m *MoE) []float32 {
	H := m.Router.In
	out := make([]float32, T*H)
	row := func(l *Linear, x []float64) []float64 {
		y := make([]float64, l.Out)
		for o := range y {
			for i, v := range x {
				y[o] += v * float64(l.W[o*l.In+i])
			}
		}
		return y
	}
	mlp := func(x *Expert, in []float64) []float64 {
		g, u := row(x.Gate, in), row(x.Up, in)
		for i := range g {
			g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
		}
		return row(x.Down, g)
	}
	for t := range T {
		in := make([]float64, H)
		for i := range in {
			in[i] = float64(h[t*H+i])
		}
		p := softmaxF64(row(m.Router, in))
		idx := make([]int, len(p))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return p[idx[a]] > p[idx[b]] })
		top := idx[:m.TopK]
		var sum float64
		for _, e := range top {
			sum += p[e]
		}
		acc := make([]float64, H)
		for _, e := range top {
			w := p[e]
			if m.NormTopK {
				w /= sum
			}
			for i, v := range mlp(m.Experts[e], in) {
				acc[i] += w * v
			}
		}
		if m.Shared != nil {
			s := 1 / (1 + math.Exp(-row(m.SharedGate, in)[0]))
			for i, v := range mlp(m.Shared, in) {
				acc[i] += s * v
			}
		}
		for i, v := range acc {
			out[t*H+i] = float32(v)
		}
	}
	return out
}

func moeModel(t *testing.T, js string, bias bool, seed uint64) *Model {
	t.Helper()
	cfg := mustConfig(t, js)
	m, err := Load(cfg, randomWeights(cfg, bias, !cfg.TieEmbeddings, rand.New(rand.NewPCG(seed, 11))))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func randomHidden(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// TestMoEMatchesNaive: each family's mixture of experts equals transformers' algorithm written
// token by token in float64, and a whole forward pass runs on it.
func TestMoEMatchesNaive(t *testing.T) {
	for _, tc := range moeTestConfigs {
		t.Run(tc.name, func(t *testing.T) {
			m := moeModel(t, tc.json, tc.bias, 5)
			r := rand.New(rand.NewPCG(9, 9))
			sparse := 0
			for i := range m.Config.Layers {
				b, err := m.Block(i)
				if err != nil {
					t.Fatal(err)
				}
				if (b.MoE != nil) != m.Config.SparseBlock(i) || (b.MoE == nil) != (b.Gate != nil) {
					t.Fatalf("block %d: experts %v, dense MLP %v", i, b.MoE != nil, b.Gate != nil)
				}
				if b.MoE == nil {
					continue
				}
				sparse++
				const T = 37
				h := randomHidden(r, T*m.Config.Hidden)
				got := make([]float32, len(h))
				if err := b.MLP(got, h, T, nil); err != nil {
					t.Fatal(err)
				}
				assertClose(t, fmt.Sprintf("block %d experts", i), got, naiveMoE(h, T, b.MoE), 1e-5)
			}
			if sparse == 0 {
				t.Fatal("no block has experts")
			}
			logits := logitsAfter(t, m.Config, m.weights.(*MapWeights), nil)
			if len(logits) != 8*m.Config.Vocab {
				t.Errorf("%d logits", len(logits))
			}
		})
	}
}

// TestMixtralQwenLayout: a Mixtral checkpoint written with Qwen's names (mlp.gate,
// mlp.experts.N.gate_proj) loads as the same model.
func TestMixtralQwenLayout(t *testing.T) {
	m := moeModel(t, moeTestConfigs[0].json, false, 3)
	w := m.weights.(*MapWeights)
	renamed := NewMapWeights()
	repl := strings.NewReplacer("block_sparse_moe.", "mlp.", ".w1.", ".gate_proj.", ".w3.", ".up_proj.", ".w2.", ".down_proj.")
	for name, d := range w.Data {
		renamed.Set(repl.Replace(name), d, w.Shapes[name]...)
	}
	want := logitsAfter(t, m.Config, w, nil)
	if got := logitsAfter(t, m.Config, renamed, nil); !slices.Equal(got, want) {
		t.Error("the Qwen-named Mixtral computes different logits")
	}
	// A missing expert and the fused layout of transformers 5's memory are named.
	delete(renamed.Shapes, "model.layers.1.mlp.experts.3.up_proj.weight")
	m2, err := Load(m.Config, renamed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Block(1); err == nil || !strings.Contains(err.Error(), "experts.3.up_proj.weight") {
		t.Errorf("missing expert tensor: error %v", err)
	}
	renamed.Set("model.layers.0.mlp.experts.gate_up_proj", []float32{0}, 1)
	if _, err := m2.Block(0); err == nil || !strings.Contains(err.Error(), "fused expert tensors") {
		t.Errorf("fused experts: error %v", err)
	}
}

// TestMoEGroups: a MoE block's groups in forward order, its stages, and every linear found by
// its full name.
func TestMoEGroups(t *testing.T) {
	m := moeModel(t, moeTestConfigs[2].json, true, 1)
	b, err := m.Block(0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Group{GroupQKV, GroupO, GroupGateUp}
	for e := range 5 {
		want = append(want, ExpertGateUp(e))
	}
	for e := range 5 {
		want = append(want, ExpertDown(e))
	}
	want = append(want, GroupDown)
	if got := b.Groups(); !slices.Equal(got, want) {
		t.Errorf("groups %v, want %v", got, want)
	}
	if st := b.Stages(); len(st) != 4 || len(st[2]) != 6 || len(st[3]) != 6 {
		t.Errorf("stages %v", st)
	}
	if g := ExpertDown(3); g.String() != "expert3.down" || g.Stage() != 3 || ExpertGateUp(3).Stage() != 2 {
		t.Errorf("ExpertDown(3): %s stage %d", g, g.Stage())
	}
	all := b.AllLinears()
	if len(all) != m.Config.blockLinears(0) {
		t.Errorf("%d linears, config says %d", len(all), m.Config.blockLinears(0))
	}
	for _, l := range all {
		got, err := b.Linear(l.Name)
		if err != nil || got != l {
			t.Errorf("Linear(%q): %v", l.Name, err)
		}
	}
	if gu := b.Linears(GroupGateUp); len(gu) != 4 || !strings.HasSuffix(gu[0].Name, "mlp.gate") || !strings.HasSuffix(gu[1].Name, "shared_expert_gate") {
		t.Errorf("gate_up group: %v", gu)
	}
	if _, err := b.Linear("gate_proj"); err == nil {
		t.Error("a short MLP name resolved in a block of experts")
	}
	if l, err := b.Linear("q_proj"); err != nil || l != b.Q {
		t.Errorf("q_proj: %v", err)
	}
}

// TestCaptureMoE: each expert's observed inputs are the rows of the block's normed hidden
// state routed to it (none for some), its down input silu(gate)·up of them; the shared
// expert's down input is made from every token; true-sequential calibration updates a MoE
// block stage by stage.
func TestCaptureMoE(t *testing.T) {
	for _, tc := range moeTestConfigs {
		t.Run(tc.name, func(t *testing.T) {
			m := moeModel(t, tc.json, tc.bias, 7)
			r := rand.New(rand.NewPCG(1, 1))
			seqs := [][]int{randomIDs(r, 23, m.Config.Vocab), randomIDs(r, 23, m.Config.Vocab)}
			rec := newRecorder()
			var steps [][]Group
			rec.replace = func(b *Block, groups []Group) error {
				if b.Index == 0 {
					steps = append(steps, groups)
				}
				return nil
			}
			if err := Calibrate(m, seqs, rec, CalibrateOptions{TrueSequential: true}); err != nil {
				t.Fatal(err)
			}
			for i := range m.Config.Layers {
				b, _ := m.Block(i)
				if b.MoE == nil {
					continue
				}
				if i == 0 && !slices.Equal(flatten(steps), b.Groups()) {
					t.Errorf("block 0 updated %v, want its stages %v", steps, b.Stages())
				}
				for s := range seqs {
					checkExpertInputs(t, rec, b, s, len(seqs[s]))
				}
			}
		})
	}
}

func flatten(steps [][]Group) []Group {
	var all []Group
	for _, s := range steps {
		all = append(all, s...)
	}
	return all
}

func checkExpertInputs(t *testing.T, rec *recorder, b *Block, s, T int) {
	t.Helper()
	H := b.cfg.Hidden
	h := rec.input(t, b.Index, GroupGateUp, s)
	routes := b.MoE.Route(h, T)
	rows := 0
	for e, x := range b.MoE.Experts {
		var tokens []int
		for j, ex := range routes.Expert {
			if ex == e {
				tokens = append(tokens, j/routes.K)
			}
		}
		in := rec.input(t, b.Index, ExpertGateUp(e), s)
		where := fmt.Sprintf("block %d seq %d expert %d", b.Index, s, e)
		if !slices.Equal(in, rowsOf(h, tokens, H)) {
			t.Errorf("%s: gate/up input is not the routed rows of the normed hidden state", where)
		}
		rows += len(in) / H
		act := naiveLinear(in, x.Gate, len(tokens))
		siluMul(act, naiveLinear(in, x.Up, len(tokens)))
		assertClose(t, where+" down input", rec.input(t, b.Index, ExpertDown(e), s), act, 1e-5)
	}
	if rows != T*b.MoE.TopK {
		t.Errorf("block %d: experts saw %d rows, want %d tokens × %d", b.Index, rows, T, b.MoE.TopK)
	}
	if sh := b.MoE.Shared; sh != nil {
		act := naiveLinear(h, sh.Gate, T)
		siluMul(act, naiveLinear(h, sh.Up, T))
		assertClose(t, "shared expert's down input", rec.input(t, b.Index, GroupDown, s), act, 1e-5)
	}
}

// rowsOf returns the listed rows of x [·, cols].
func rowsOf(x []float32, rows []int, cols int) []float32 {
	out := []float32{}
	for _, r := range rows {
		out = append(out, x[r*cols:(r+1)*cols]...)
	}
	return out
}

// orderRecorder is a recorder that also lists the groups in the order it observed them.
type orderRecorder struct {
	*recorder
	order []Group
}

func (r *orderRecorder) Observe(block int, g Group, x []float32, rows, cols int) error {
	if block == 0 {
		r.order = append(r.order, g)
	}
	return r.recorder.Observe(block, g, x, rows, cols)
}

// TestExpertObservation: with a WeightPower each routed row is observed times its routing
// weight^(p/2); an expert AllTokens names observes silu(gate)·up of every token as its down
// input; every gate/up input of a step is observed before its first down input (observe-only
// and single-step calibrations alike; with GateUpAgain the experts' gate/up inputs come again,
// the same, in the down pass), and the block's outputs do not change.
func TestExpertObservation(t *testing.T) {
	js := moeTestConfigs[2].json // a shared expert too
	r := rand.New(rand.NewPCG(4, 4))
	cfg := mustConfig(t, js)
	seqs := [][]int{randomIDs(r, 19, cfg.Vocab), randomIDs(r, 19, cfg.Vocab), randomIDs(r, 19, cfg.Vocab)}
	all := func(block, e int) bool { return e%2 == 1 }
	again := func(block int) bool { return true }
	for _, opt := range []CalibrateOptions{
		{Experts: ExpertObservation{AllTokens: all, WeightPower: 2}},
		{ObserveOnly: true, Experts: ExpertObservation{AllTokens: all, WeightPower: 1}},
		{Experts: ExpertObservation{AllTokens: all, WeightPower: 2, GateUpAgain: again}},
		{ObserveOnly: true, Experts: ExpertObservation{AllTokens: all, WeightPower: 1, GateUpAgain: again}},
	} {
		m := moeModel(t, js, true, 2)
		rec := &orderRecorder{recorder: newRecorder()}
		if err := Calibrate(m, seqs, rec, opt); err != nil {
			t.Fatal(err)
		}
		twice := opt.Experts.GateUpAgain != nil
		firstDown := slices.IndexFunc(rec.order, func(g Group) bool { return g.Stage() == 3 })
		gateUps, before := 0, 0 // the experts' gate/up inputs observed, and those before the first down input
		for i, g := range rec.order {
			if _, expert := g.Expert(); expert && g.Stage() == 2 {
				gateUps++
				if i < firstDown {
					before++
				}
			}
		}
		if n := len(seqs) * cfg.MoE.Experts; firstDown < 0 || before < n || twice != (gateUps == 2*n) || !twice && gateUps != n {
			t.Errorf("observe-only %v, again %v: %d experts' gate/up inputs observed, %d before the first down input; %d sequences × experts",
				opt.ObserveOnly, twice, gateUps, before, n)
		}
		b, _ := m.Block(0)
		for s := range seqs {
			h := rec.input(t, 0, GroupGateUp, s)
			T := len(seqs[s])
			routes := b.MoE.Route(h, T)
			for e, x := range b.MoE.Experts {
				var want []float32
				var tokens []int
				for j, ex := range routes.Expert {
					if ex != e {
						continue
					}
					f := float32(math.Pow(float64(routes.Weight[j]), opt.Experts.WeightPower/2))
					for _, v := range h[j/routes.K*cfg.Hidden : (j/routes.K+1)*cfg.Hidden] {
						want = append(want, f*v)
					}
					tokens = append(tokens, j/routes.K)
				}
				where := fmt.Sprintf("observe-only %v, seq %d, expert %d", opt.ObserveOnly, s, e)
				assertClose(t, where+" gate/up input", rec.input(t, 0, ExpertGateUp(e), s), want, 1e-6)
				if twice && !slices.Equal(rec.input(t, 0, ExpertGateUp(e), len(seqs)+s), rec.input(t, 0, ExpertGateUp(e), s)) {
					t.Errorf("%s: gate/up input handed again differs", where)
				}
				if all(0, e) {
					act := naiveLinear(h, x.Gate, T)
					siluMul(act, naiveLinear(h, x.Up, T))
					assertClose(t, where+" down input over every token", rec.input(t, 0, ExpertDown(e), s), act, 1e-5)
				} else if n := len(rec.input(t, 0, ExpertDown(e), s)) / x.Down.In; n != len(tokens) {
					t.Errorf("%s: down input of %d rows, %d routed", where, n, len(tokens))
				}
			}
		}
		// The next block's inputs are those of a plain calibration.
		plain := newRecorder()
		if err := Calibrate(moeModel(t, js, true, 2), seqs, plain, CalibrateOptions{ObserveOnly: opt.ObserveOnly}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(plain.input(t, 1, GroupQKV, 2), rec.input(t, 1, GroupQKV, 2)) {
			t.Errorf("observe-only %v: observing the experts changed the next block's input", opt.ObserveOnly)
		}
	}
}
