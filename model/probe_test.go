package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
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

// laneRecorder is a probe engine with three lanes that records each stream's calls and notes
// calls that overlap on one lane (a GPU takes one caller at a time).
type laneRecorder struct {
	mu      sync.Mutex
	busy    [3]bool
	overlap bool
	calls   map[int][]string // by stream slot
	failOn  string           // a linear whose swap fails
}

func (r *laneRecorder) lanes() int          { return len(r.busy) }
func (r *laneRecorder) laneOf(slot int) int { return (slot - 1) % len(r.busy) }

func (r *laneRecorder) record(slot int, call string) {
	lane := r.laneOf(slot)
	r.mu.Lock()
	r.overlap = r.overlap || r.busy[lane]
	r.busy[lane] = true
	r.calls[slot] = append(r.calls[slot], call)
	r.mu.Unlock()
	time.Sleep(100 * time.Microsecond) // long enough for another caller on the lane to show
	r.mu.Lock()
	r.busy[lane] = false
	r.mu.Unlock()
}

func (r *laneRecorder) alloc(int) error                  { return nil }
func (r *laneRecorder) embed(int) error                  { return nil }
func (r *laneRecorder) enter(*Block) error               { return nil }
func (r *laneRecorder) leave() error                     { return nil }
func (r *laneRecorder) close() error                     { return nil }
func (r *laneRecorder) meanKL(int, int) (float64, error) { return 0, nil }

func (r *laneRecorder) copy(dst, src int) error {
	r.record(dst, fmt.Sprintf("copy from %d", src))
	return nil
}

func (r *laneRecorder) forward(from, to int) error {
	r.record(from, fmt.Sprintf("forward to %d", to))
	return nil
}

func (r *laneRecorder) swap(slot int, l *Linear, _ []float32) error {
	r.record(slot, "swap "+l.Name)
	if l.Name == r.failOn {
		return errors.New("no room")
	}
	return nil
}

func (r *laneRecorder) restore(slot int, l *Linear) error {
	r.record(slot, "restore "+l.Name)
	return nil
}

// TestProbeBlockLanes: a block's probes on an engine of several lanes (GPUs) take the next
// slots in the block's order, each run as copy, swap, forward, restore on its slot's lane, the
// lanes at once but never two calls on one lane; the names come back in order, and a failed
// swap names its linear.
func TestProbeBlockLanes(t *testing.T) {
	var p prepared
	for i := range 7 {
		p.linears = append(p.linears, &Linear{Name: fmt.Sprintf("l%d", i)})
		w := []float32{1}
		if i == 1 || i == 5 { // left out
			w = nil
		}
		p.weights = append(p.weights, w)
	}
	eng := &laneRecorder{calls: map[int][]string{}}
	names, err := probeBlock(eng, p, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "l0", "l2", "l3", "l4", "l6"}; !slices.Equal(names, want) {
		t.Fatalf("names %v, want %v", names, want)
	}
	for i, name := range names[2:] {
		slot := 3 + i
		want := []string{"copy from 0", "swap " + name, fmt.Sprintf("forward to %d", slot+1), "restore " + name}
		if got := eng.calls[slot]; !slices.Equal(got, want) {
			t.Errorf("slot %d: calls %q, want %q", slot, got, want)
		}
	}
	if len(eng.calls) != 5 {
		t.Errorf("calls on %d slots, want 5", len(eng.calls))
	}
	if eng.overlap {
		t.Error("two calls overlapped on one lane")
	}
	eng = &laneRecorder{calls: map[int][]string{}, failOn: "l3"}
	if _, err := probeBlock(eng, p, nil); err == nil || !strings.Contains(err.Error(), "probe of l3") {
		t.Errorf("a failed swap of l3: %v", err)
	}
}
