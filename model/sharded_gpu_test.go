package model

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/gputest"
)

// shardedRecorder is gramRecorder for a sharded calibration: a gramRecorder per engine, whose
// Gram matrices are summed over the shards at each Update, before the weights are replaced
// once. With tokens set it counts the rows every shard hands it (routedTokens).
type shardedRecorder struct {
	shards      []*gramRecorder
	grams       map[string][]float64 // the shards' sums
	observeOnly bool
	tokens      *routedTokens
}

func (s *shardedRecorder) ObserveShard(shard, block int, g Group, x cuda.DevicePtr, rows, cols int) error {
	s.tokens.add(block, g, rows)
	return s.shards[shard].ObserveGPU(block, g, x, rows, cols)
}

func (s *shardedRecorder) Update(b *Block, groups []Group) error {
	for _, r := range s.shards {
		r.observeOnly = true // download and free each shard's sums; the weights change once, below
		if err := r.Update(b, groups); err != nil {
			return err
		}
	}
	for _, g := range groups {
		key := fmt.Sprintf("%d/%s", b.Index, g)
		sum := make([]float64, len(s.shards[0].grams[key]))
		for _, r := range s.shards {
			for i, v := range r.grams[key] {
				sum[i] += v
			}
		}
		s.grams[key] = sum
	}
	if s.observeOnly {
		return nil
	}
	return s.shards[0].replaceWeights(b, groups)
}

// routedTokens counts, per block, the rows of every token's gate/up input and of each expert's
// routed gate/up input that a calibration observed, as a calibrator choosing which experts to
// observe on every token does (convert's expertRouting): allTokens chooses the experts that
// fewer tokens than the mean reached, and reports an error when it is asked before the
// gate/up inputs of all the block's tokens were observed, on every GPU.
type routedTokens struct {
	t      *testing.T
	tokens int // of the calibration
	mu     sync.Mutex
	every  map[int]int    // block → rows of GroupGateUp
	routed map[[2]int]int // (block, expert) → routed rows
}

func newRoutedTokens(t *testing.T, tokens int) *routedTokens {
	return &routedTokens{t: t, tokens: tokens, every: map[int]int{}, routed: map[[2]int]int{}}
}

func (r *routedTokens) add(block int, g Group, rows int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if g == GroupGateUp {
		r.every[block] += rows
	}
	if e, ok := g.Expert(); ok && g.Stage() == GroupGateUp.Stage() {
		r.routed[[2]int{block, e}] += rows
	}
}

func (r *routedTokens) observation(cfg *Config) ExpertObservation {
	return ExpertObservation{WeightPower: 2, AllTokens: func(block, e int) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.every[block] != r.tokens {
			r.t.Errorf("block %d: asked how expert %d's down input is observed after %d of the %d tokens' gate/up inputs", block, e, r.every[block], r.tokens)
		}
		return r.routed[[2]int{block, e}]*cfg.MoE.Experts < r.tokens*cfg.MoE.TopK
	}}
}

// countingCPU is a gramRecorder for the CPU calibration that counts the rows it observes.
type countingCPU struct {
	*gramRecorder
	tokens *routedTokens
}

func (c countingCPU) Observe(block int, g Group, x []float32, rows, cols int) error {
	c.tokens.add(block, g, rows)
	return c.gramRecorder.Observe(block, g, x, rows, cols)
}

// TestGPUShardedCalibrationMatchesCPU: calibrated on two and three engines (one per GPU, or
// several on GPU 0), each with its share of the sequences, the Gram matrices summed over the
// shards equal the CPU calibration's over every sequence, with every group's weights replaced
// between the steps (true-sequential, staged) and per block, and an observe-only pass; the third
// block's weights come ahead, uploaded while the second calibrates, and the second's, where
// there are updates, from the first's last update on. For a mixture of experts the
// experts whose down inputs are observed on every token are chosen from the tokens routed to
// them on all the GPUs: no GPU observes a down input before every GPU has observed its gate/up
// inputs.
func TestGPUShardedCalibrationMatchesCPU(t *testing.T) {
	for _, family := range []string{gpuTestConfigs[0].json, moeTestConfigs[2].json} {
		cfg := mustConfig(t, strings.Replace(family, `"num_hidden_layers": 2`, `"num_hidden_layers": 3`, 1))
		for _, engines := range []int{2, 3} {
			for _, opt := range []CalibrateOptions{{TrueSequential: true}, {}, {ObserveOnly: true}} {
				t.Run(fmt.Sprintf("%s/engines=%d/true-sequential=%v/observe-only=%v", cfg.ModelType, engines, opt.TrueSequential, opt.ObserveOnly), func(t *testing.T) {
					testShardedCalibration(t, cfg, engines, opt)
				})
			}
		}
	}
}

func testShardedCalibration(t *testing.T, cfg *Config, engines int, opt CalibrateOptions) {
	es := openGPUs(t, cfg, GPUOptions{}, 50, engines)
	r := freshRand(t)
	w := randomWeights(cfg, false, !cfg.TieEmbeddings, r)
	seqs := make([][]int, 7)
	for i := range seqs {
		seqs[i] = randomIDs(r, 23, cfg.Vocab)
	}
	onCPU := newGramRecorder(es[0])
	onCPU.observeOnly = opt.ObserveOnly
	sharded := &shardedRecorder{grams: map[string][]float64{}, observeOnly: opt.ObserveOnly}
	for _, e := range es {
		sharded.shards = append(sharded.shards, newGramRecorder(e))
	}
	var cpu Calibrator = onCPU
	cpuOpt, shardedOpt := opt, opt
	if cfg.IsMoE() {
		counted := countingCPU{onCPU, newRoutedTokens(t, 7*23)}
		sharded.tokens = newRoutedTokens(t, 7*23)
		cpu, cpuOpt.Experts, shardedOpt.Experts = counted, counted.tokens.observation(cfg), sharded.tokens.observation(cfg)
	}
	for _, run := range []func(m *Model) error{
		func(m *Model) error { return Calibrate(m, seqs, cpu, cpuOpt) },
		func(m *Model) error { return CalibrateSharded(es, m, seqs, sharded, shardedOpt) },
	} {
		m, err := Load(cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		if err := run(m); err != nil {
			t.Fatal(err)
		}
	}
	// The third block goes up while the second calibrates, and the second from the first's last
	// update on, where there are updates.
	want := 2
	if opt.ObserveOnly {
		want = 1
	}
	if es[0].blocksAhead != want {
		t.Errorf("%d blocks' weights were uploaded ahead, want %d", es[0].blocksAhead, want)
	}
	if len(sharded.grams) != groupCount(cfg) {
		t.Fatalf("sharded calibration observed %d groups, want %d", len(sharded.grams), groupCount(cfg))
	}
	for key, want := range onCPU.cpu {
		if rel := relativeDiff(sharded.grams[key], want); !(rel < 1e-5) {
			t.Errorf("%s: Gram matrix summed over %d shards: relative error %.2e", key, engines, rel)
		}
	}
}

// TestGPUSumUpperShards: 2, 3 and 4 engines (one per GPU where there are as many, with peer
// access, or several on one GPU), each summing a band of columns of fresh random matrices
// (unequal bands, an empty one included) at once, then each mirroring its own: every matrix's
// upper triangle is the float32 sum in shard order, bit for bit, and its lower triangle the
// mirror.
func TestGPUSumUpperShards(t *testing.T) {
	r := freshRand(t)
	cfg := mustConfig(t, gpuTestConfigs[0].json)
	for _, shards := range []int{2, 3, 4} {
		for _, k := range []int{1, 77, 300} {
			t.Run(fmt.Sprintf("shards=%d/k=%d", shards, k), func(t *testing.T) {
				devs := gputest.OpenMany(t, shards)
				if _, err := cuda.EnablePeerAccess(devs); err != nil {
					t.Fatal(err)
				}
				for _, a := range devs {
					for _, b := range devs {
						if !a.Reaches(b) {
							t.Skipf("GPU %d does not reach GPU %d's memory", a.Info().Ordinal, b.Info().Ordinal)
						}
					}
				}
				host := make([][]float32, shards)
				ptrs := make([]cuda.DevicePtr, shards)
				es := make([]*GPU, shards)
				for i, dev := range devs {
					e, err := newGPU(dev, cfg, GPUOptions{}, gputest.PTX(t, modelPTX, *gpuPTX), gputest.Cubins(*gpuPTX, modelCubinSM90)...)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { e.Close() })
					es[i] = e
					host[i] = make([]float32, k*k)
					for j := range host[i] {
						host[i][j] = float32(r.NormFloat64() * 100)
					}
					ptrs[i] = gputest.Floats(t, dev, host[i])
				}
				bands := make([]int, shards+1) // unequal, the first empty
				for i := 2; i <= shards; i++ {
					bands[i] = i * k / shards
				}
				errs := make(chan error, shards)
				for i, e := range es {
					go func() {
						err := e.SumUpperShards(ptrs, k, bands[i], bands[i+1])
						if err == nil {
							err = e.Synchronize()
						}
						errs <- err
					}()
				}
				for range es {
					if err := <-errs; err != nil {
						t.Fatal(err)
					}
				}
				for i, e := range es {
					if err := e.FinishGram(ptrs[i], k); err != nil {
						t.Fatal(err)
					}
					if err := e.Synchronize(); err != nil {
						t.Fatal(err)
					}
				}
				for i, dev := range devs {
					got := make([]float32, k*k)
					if err := dev.CopyFromDevice(cuda.Bytes(got), ptrs[i]); err != nil {
						t.Fatal(err)
					}
					for c := range k {
						for row := range k {
							upper := row + c*k
							if row > c {
								upper = c + row*k
							}
							want := host[0][upper]
							for _, h := range host[1:] {
								want += h[upper]
							}
							if got[row+c*k] != want {
								t.Fatalf("matrix %d (%d, %d): %g, want %g", i, row, c, got[row+c*k], want)
							}
						}
					}
				}
			})
		}
	}
}
