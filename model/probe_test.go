package model

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// noisy replaces a linear's weight by a copy with relative Gaussian noise of the given size,
// the same for every call with the same linear (seeded by its name).
func noisy(size float64) Replacement {
	return func(l *Linear) ([]float32, error) {
		var seed uint64
		for _, c := range l.Name {
			seed = seed*31 + uint64(c)
		}
		r := rand.New(rand.NewPCG(seed, 3))
		w := make([]float32, len(l.W))
		for i, v := range l.W {
			w[i] = v + float32(size*r.NormFloat64())*float32(math.Abs(float64(v))+1e-3)
		}
		return w, nil
	}
}

func probeSeqs(r *rand.Rand, n, T, vocab int) [][]int {
	seqs := make([][]int, n)
	for i := range seqs {
		seqs[i] = randomIDs(r, T, vocab)
	}
	return seqs
}

// TestLinearKLMatchesWholeModel: each probe's KL equals the one measured by running the whole
// model with that linear replaced (a dense model's, and every expert's and router's of a
// mixture of experts), and splitting the probe into sweeps changes nothing.
func TestLinearKLMatchesWholeModel(t *testing.T) {
	for _, js := range []string{gpuTestConfigs[0].json, moeTestConfigs[0].json} {
		cfg := mustConfig(t, strings.Replace(js, `"num_hidden_layers": 2`, `"num_hidden_layers": 3`, 1))
		testLinearKLMatchesWholeModel(t, cfg)
	}
}

func testLinearKLMatchesWholeModel(t *testing.T, cfg *Config) {
	r := rand.New(rand.NewPCG(11, 12))
	m := randomModel(t, cfg, false, r)
	seqs := probeSeqs(r, 2, 9, cfg.Vocab)
	replace := noisy(0.05)
	one, err := LinearKL(m, seqs, replace, 1<<30, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != cfg.allLinears() {
		t.Fatalf("%d probes, want %d", len(one), cfg.allLinears())
	}
	ref := wholeModelKLs(t, m, seqs, replace)
	unused := 0 // experts no token of the sequences reached: KL 0 both ways
	for name, want := range ref {
		got := one[name]
		if want == 0 && got == 0 {
			unused++
		} else if want <= 0 || math.Abs(got-want) > 1e-9*want {
			t.Errorf("%s: probe KL %g, whole model %g", name, got, want)
		}
	}
	if unused > len(ref)/4 {
		t.Errorf("%d of %d probes measured nothing", unused, len(ref))
	}
	// One block's probes per sweep (and the reference and resume slots).
	swept, err := LinearKL(m, seqs, replace, int64(cfg.maxBlockLinears()+2)*streamBytes(m, seqs), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range one {
		if swept[name] != want {
			t.Errorf("%s: %g in sweeps, %g in one", name, swept[name], want)
		}
	}
}

// wholeModelKLs is the slow definition: replace one linear, run every sequence through the
// whole model, compare with the original, put the weight back.
func wholeModelKLs(t *testing.T, m *Model, seqs [][]int, replace Replacement) map[string]float64 {
	t.Helper()
	want := map[string]float64{}
	vocab := m.Config.Vocab
	for i := range m.Config.Layers {
		b, err := m.Block(i)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range b.AllLinears() {
			{
				w, _ := replace(l)
				var st tokenStats
				for _, seq := range seqs {
					lr, err := m.Logits(seq)
					if err != nil {
						t.Fatal(err)
					}
					orig := l.W
					l.W = w
					lt, err := m.Logits(seq)
					l.W = orig
					if err != nil {
						t.Fatal(err)
					}
					st.compareLogits(lr, lt, seq, vocab)
				}
				want[l.Name] = st.comparison(len(seqs), len(seqs[0])).MeanKL
			}
		}
	}
	return want
}

// TestLinearKLIdentityAndSkips: the original weights give KL 0, nil leaves a linear out, and
// bad replacements and sequences are refused by name.
func TestLinearKLIdentityAndSkips(t *testing.T) {
	cfg := mustConfig(t, gpuTestConfigs[0].json)
	r := rand.New(rand.NewPCG(5, 6))
	m := randomModel(t, cfg, false, r)
	seqs := probeSeqs(r, 2, 7, cfg.Vocab)
	same := func(l *Linear) ([]float32, error) {
		if strings.HasSuffix(l.Name, "k_proj") {
			return nil, nil
		}
		return append([]float32(nil), l.W...), nil
	}
	kl, err := LinearKL(m, seqs, same, 1<<30, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(kl) != 6*cfg.Layers {
		t.Errorf("%d probes, want %d (k_proj left out)", len(kl), 6*cfg.Layers)
	}
	for name, v := range kl {
		if v != 0 || strings.HasSuffix(name, "k_proj") {
			t.Errorf("%s: KL %g with its own weights", name, v)
		}
	}
	short := func(l *Linear) ([]float32, error) { return l.W[:1], nil }
	if _, err := LinearKL(m, seqs, short, 1<<30, nil); err == nil || !strings.Contains(err.Error(), "q_proj: replacement has 1 values") {
		t.Errorf("short replacement: %v", err)
	}
	if _, err := LinearKL(m, [][]int{{1, 2}, {3}}, same, 1<<30, nil); err == nil || !strings.Contains(err.Error(), "sequence 1 has 1 tokens") {
		t.Errorf("ragged sequences: %v", err)
	}
}
