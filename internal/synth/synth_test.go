package synth

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/npy"
	"github.com/qpack-dev/qpack/safetensors"
)

func TestWriteLoadsAsLlama(t *testing.T) {
	cfg := Config{Layers: 3, Hidden: 64, Intermediate: 96, Heads: 4, KVHeads: 2, Vocab: 100, MaxShard: 40_000, Seed: 7}
	dir := t.TempDir()
	if err := Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if n := len(ck.Names()); n != 2+9*3+1 {
		t.Fatalf("%d tensors", n)
	}
	if len(ck.Files()) < 2 {
		t.Errorf("MaxShard did not shard: %v", ck.Files())
	}
	w, err := ck.Float32("model.layers.1.mlp.down_proj.weight")
	if err != nil {
		t.Fatal(err)
	}
	var sum, sq float64
	for _, v := range w {
		sum += float64(v)
		sq += float64(v) * float64(v)
	}
	std := math.Sqrt(sq/float64(len(w)) - (sum/float64(len(w)))*(sum/float64(len(w))))
	if std < 0.01 || std > 0.04 {
		t.Errorf("weights have std %v, want about 0.02", std)
	}
	m, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	logits, err := m.Logits([]int{1, 2, 3})
	if err != nil || len(logits) != 3*100 {
		t.Fatalf("forward: %v, %d logits", err, len(logits))
	}
}

func TestSeedDeterminesWeights(t *testing.T) {
	cfg := Config{Layers: 1, Hidden: 32, Intermediate: 48, Heads: 2, KVHeads: 2, Vocab: 50}
	read := func(seed uint64) []byte {
		dir := t.TempDir()
		c := cfg
		c.Seed = seed
		if err := Write(dir, c); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if !bytes.Equal(read(1), read(1)) {
		t.Errorf("the same seed gave different files")
	}
	if bytes.Equal(read(1), read(2)) {
		t.Errorf("different seeds gave the same file")
	}
	if err := Write(t.TempDir(), Config{Layers: 1, Hidden: 30, Intermediate: 8, Heads: 4, KVHeads: 4, Vocab: 8}); err == nil {
		t.Errorf("hidden not divisible by heads should fail")
	}
}

// TestWriteExperts: with experts the checkpoint is a Mixtral the engine loads, every block a
// mixture of experts routed top-k.
func TestWriteExperts(t *testing.T) {
	cfg := Config{Layers: 2, Hidden: 64, Intermediate: 48, Heads: 4, KVHeads: 2, Vocab: 100, Seed: 3, Experts: 5, ExpertsPerToken: 2, CalibIDs: 300}
	dir := t.TempDir()
	if err := Write(dir, cfg); err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := m.Config
	if c.ModelType != "mixtral" || c.MoE.Experts != 5 || c.MoE.TopK != 2 || c.MoE.Intermediate != 48 || !c.SparseBlock(1) {
		t.Fatalf("config %+v", c)
	}
	b, err := m.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	if b.MoE == nil || len(b.MoE.Experts) != 5 || b.MoE.Experts[4].Down.In != 48 {
		t.Fatalf("block 1 experts: %+v", b.MoE)
	}
	if logits, err := m.Logits([]int{1, 2, 3}); err != nil || len(logits) != 3*100 {
		t.Fatalf("forward: %v, %d logits", err, len(logits))
	}
	a, err := npy.ReadFile(filepath.Join(dir, CalibIDsFile))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := a.Ints()
	if err != nil || len(ids) != 300 || slices.Min(ids) < 0 || slices.Max(ids) >= 100 || slices.Min(ids) == slices.Max(ids) {
		t.Errorf("calibration ids: %d of them in [%d, %d] (%v)", len(ids), slices.Min(ids), slices.Max(ids), err)
	}
	if err := Write(t.TempDir(), Config{Layers: 1, Hidden: 32, Intermediate: 8, Heads: 4, KVHeads: 4, Vocab: 8, Experts: 2, ExpertsPerToken: 3}); err == nil {
		t.Errorf("3 experts per token of 2 should fail")
	}
}
