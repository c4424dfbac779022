package model

import (
	"fmt"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/gputest"
)

// shardedRecorder is gramRecorder for a sharded calibration: a gramRecorder per engine, whose
// Gram matrices are summed over the shards at each Update, before the weights are replaced
// once.
type shardedRecorder struct {
	shards      []*gramRecorder
	grams       map[string][]float64 // the shards' sums
	observeOnly bool
}

func (s *shardedRecorder) ObserveShard(shard, block int, g Group, x cuda.DevicePtr, rows, cols int) error {
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

// TestGPUShardedCalibrationMatchesCPU: calibrated on two and three engines (one per GPU, or
// several on GPU 0), each with its share of the sequences, the Gram matrices summed over the
// shards equal the CPU calibration's over every sequence, with every group's weights replaced
// between the steps (true-sequential, staged) and per block, and an observe-only pass; the third
// block's weights come ahead, uploaded while the second calibrates.
func TestGPUShardedCalibrationMatchesCPU(t *testing.T) {
	cfg := mustConfig(t, strings.Replace(gpuTestConfigs[0].json, `"num_hidden_layers": 2`, `"num_hidden_layers": 3`, 1))
	for _, engines := range []int{2, 3} {
		for _, opt := range []CalibrateOptions{{TrueSequential: true}, {}, {ObserveOnly: true}} {
			t.Run(fmt.Sprintf("engines=%d/true-sequential=%v/observe-only=%v", engines, opt.TrueSequential, opt.ObserveOnly), func(t *testing.T) {
				var es []*GPU
				for _, dev := range gputest.OpenMany(t, engines) {
					e, err := newGPU(dev, cfg, GPUOptions{}, gputest.PTX(t, modelPTX, *gpuPTX), gputest.Cubins(*gpuPTX, modelCubinSM90)...)
					if err != nil {
						t.Fatal(err)
					}
					e.poison, e.chunkRows = true, 50
					t.Cleanup(func() { e.Close() })
					es = append(es, e)
				}
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
				for _, run := range []func(m *Model) error{
					func(m *Model) error { return Calibrate(m, seqs, onCPU, opt) },
					func(m *Model) error { return CalibrateSharded(es, m, seqs, sharded, opt) },
				} {
					m, err := Load(cfg, w)
					if err != nil {
						t.Fatal(err)
					}
					if err := run(m); err != nil {
						t.Fatal(err)
					}
				}
				if es[0].blocksAhead != 1 {
					t.Errorf("%d blocks' weights were uploaded ahead, want 1 (the third)", es[0].blocksAhead)
				}
				if len(sharded.grams) != groupCount(cfg) {
					t.Fatalf("sharded calibration observed %d groups, want %d", len(sharded.grams), groupCount(cfg))
				}
				for key, want := range onCPU.cpu {
					if rel := relativeDiff(sharded.grams[key], want); !(rel < 1e-5) {
						t.Errorf("%s: Gram matrix summed over %d shards: relative error %.2e", key, engines, rel)
					}
				}
			})
		}
	}
}
