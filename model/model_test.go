package model

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/qpack-dev/qpack/npy"
)

const tinyDir = "../testdata/models/tiny"

// smallLlamaDir is in the shared directory: $QPACK_SHARED, or ../shared beside the checkout.
var smallLlamaDir = filepath.Join(sharedDir(), "models", "small-llama")

func sharedDir() string {
	if d := os.Getenv("QPACK_SHARED"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "shared")
}

// openModel opens a test checkpoint, skipping when it is absent (the shared models are optional).
func openModel(tb testing.TB, dir string) *Model {
	tb.Helper()
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		tb.Skipf("%s not available: %v", dir, err)
	}
	m, err := Open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}

// openBF16Reference opens a BF16 checkpoint the way its reference files were made: transformers
// loaded it in bf16 (rounding the rotary inv_freq buffer to bf16) and then upcast to fp32.
func openBF16Reference(tb testing.TB, dir string) *Model {
	tb.Helper()
	m := openModel(tb, dir)
	cfg := *m.Config
	cfg.Rope.InvFreqBF16 = true
	ref, err := Load(&cfg, m.weights)
	if err != nil {
		tb.Fatal(err)
	}
	return ref
}

func heldoutIDs(tb testing.TB, dir string) []int {
	tb.Helper()
	a, err := npy.ReadFile(filepath.Join(dir, "heldout_ids.npy"))
	if err != nil {
		tb.Fatal(err)
	}
	ids, err := a.Ints()
	if err != nil {
		tb.Fatal(err)
	}
	return ids
}

// checkProbeLogits compares our logits for the first 64 held-out ids with transformers' fp32 ones.
func checkProbeLogits(t *testing.T, m *Model, dir string, tol float64) {
	checkProbeLogitsOf(t, m.Logits, dir, tol)
}

// checkProbeLogitsOf is checkProbeLogits for any forward pass.
func checkProbeLogitsOf(t *testing.T, logits func([]int) ([]float32, error), dir string, tol float64) {
	ids := heldoutIDs(t, dir)[:64]
	got, err := logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	a, err := npy.ReadFile(filepath.Join(dir, "probe_logits.npy"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := a.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("logits: got %d values, want %d (shape %v)", len(got), len(want), a.Shape)
	}
	var maxAbs, maxDiff float64
	for i := range want {
		maxAbs = max(maxAbs, math.Abs(float64(want[i])))
		maxDiff = max(maxDiff, math.Abs(float64(got[i]-want[i])))
	}
	t.Logf("max |logit| %.3f, max |diff| %.2e (%.2e relative)", maxAbs, maxDiff, maxDiff/maxAbs)
	if maxDiff > tol*maxAbs {
		t.Errorf("logits differ by %g, more than %g × max|logit| = %g", maxDiff, tol, tol*maxAbs)
	}
}

func TestProbeLogitsTiny(t *testing.T) { checkProbeLogits(t, openModel(t, tinyDir), tinyDir, 1e-5) }

// small-llama's reference was computed with bf16-rounded rotary frequencies: our float32
// frequencies stay within the acceptance bound, the bf16 ones reproduce it to float32 rounding.
func TestProbeLogitsSmallLlama(t *testing.T) {
	checkProbeLogits(t, openModel(t, smallLlamaDir), smallLlamaDir, 1e-3)
	checkProbeLogits(t, openBF16Reference(t, smallLlamaDir), smallLlamaDir, 1e-5)
}

// TestBlockAfterCloseIsAnError: once the model is closed (its mapping released), reading a
// block that is not in memory is an error, not a read of unmapped memory; Close waits for a
// block being read.
func TestBlockAfterCloseIsAnError(t *testing.T) {
	m, err := Open(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { _, err := m.Block(1); done <- err }() // a prefetch racing the close
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil && !strings.Contains(err.Error(), "closed") {
		t.Fatalf("block read during Close: %v", err)
	}
	if _, err := m.Block(0); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("block read after Close: got %v, want an error saying the model is closed", err)
	}
}

// releasingWeights is MapWeights that records the tensors released after reading.
type releasingWeights struct {
	*MapWeights
	mu       sync.Mutex
	released map[string]bool
}

func (w *releasingWeights) Release(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.released[name] = true
}

// TestBlockReleasesItsMappedTensors: a block's tensors, once read into its own float32 copies,
// are released from the weight source (memory-mapped pages leave the resident set), every one.
func TestBlockReleasesItsMappedTensors(t *testing.T) {
	cfg := mustConfig(t, gpuTestConfigs[0].json)
	w := &releasingWeights{MapWeights: randomWeights(cfg, false, !cfg.TieEmbeddings, freshRand(t)), released: map[string]bool{}}
	m, err := Load(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"}
	for _, l := range b.AllLinears() {
		want = append(want, l.Name+".weight")
	}
	for _, name := range want {
		if !w.released[name] {
			t.Errorf("%s was not released after the block read it", name)
		}
	}
}

// countingWeights is MapWeights that counts the reads of each tensor.
type countingWeights struct {
	*MapWeights
	mu    sync.Mutex
	reads map[string]int
}

func (w *countingWeights) Float32(name string) ([]float32, error) {
	w.mu.Lock()
	w.reads[name]++
	w.mu.Unlock()
	return w.MapWeights.Float32(name)
}

// TestBlocksAreReadOnceWhenAskedAtOnce: blocks asked for by several goroutines at once (the
// calibration and its prefetches) are read once each, and every caller gets the same block.
func TestBlocksAreReadOnceWhenAskedAtOnce(t *testing.T) {
	cfg := mustConfig(t, gpuTestConfigs[0].json)
	w := &countingWeights{MapWeights: randomWeights(cfg, false, !cfg.TieEmbeddings, freshRand(t)), reads: map[string]int{}}
	m, err := Load(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	const callers = 4
	got := make([][]*Block, cfg.Layers)
	var mu sync.Mutex
	var all sync.WaitGroup
	for i := range cfg.Layers {
		for range callers {
			all.Go(func() {
				b, err := m.Block(i)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got[i] = append(got[i], b)
				mu.Unlock()
			})
		}
	}
	all.Wait()
	for i, bs := range got {
		for _, b := range bs {
			if b != bs[0] {
				t.Errorf("block %d: callers got different blocks", i)
			}
		}
		if n := w.reads[fmt.Sprintf("model.layers.%d.self_attn.q_proj.weight", i)]; n != 1 {
			t.Errorf("block %d was read %d times, want once", i, n)
		}
	}
}

// TestRecycledBlockMemoryIsReadInto: a recycled block's memory is read into by the next block of
// the same shapes, whose values are those a fresh read gives; a released block's is not reused.
func TestRecycledBlockMemoryIsReadInto(t *testing.T) {
	m, err := Open(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	fresh, err := Open(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	b0, err := m.Block(0)
	if err != nil {
		t.Fatal(err)
	}
	old := map[*float32]bool{}
	for _, l := range b0.AllLinears() {
		old[&l.W[0]] = true
	}
	m.RecycleBlock(0)
	b1, err := m.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range b1.AllLinears() {
		if !old[&l.W[0]] {
			t.Errorf("block 1's %s was not read into block 0's recycled memory", l.Name)
		}
	}
	want, err := fresh.Block(1)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range b1.AllLinears() {
		if !slices.Equal(l.W, want.AllLinears()[i].W) {
			t.Errorf("%s read into recycled memory differs from a fresh read", l.Name)
		}
	}
	if !slices.Equal(b1.InputNorm, want.InputNorm) {
		t.Error("block 1's input norm read into recycled memory differs from a fresh read")
	}
	m.ReleaseBlock(1)
	if b0, err = m.Block(0); err != nil {
		t.Fatal(err)
	}
	for _, l := range b0.AllLinears() {
		if old[&l.W[0]] {
			t.Errorf("block 0's %s was read into memory recycled earlier", l.Name)
		}
	}
}

// TestRecycleKeepsNothingOnceEveryBlockIsRead: a block recycled while a later block is unread
// keeps its memory for that read; once every later block is read, recycling releases the block
// and drops the spares kept, as no read will take them.
func TestRecycleKeepsNothingOnceEveryBlockIsRead(t *testing.T) {
	m, err := Open(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	last := m.Config.Layers - 1
	if last < 2 {
		t.Fatalf("tiny has %d blocks; the test needs three", last+1)
	}
	spares := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		n := 0
		for _, vs := range m.spare {
			n += len(vs)
		}
		return n
	}
	for i := range last {
		if _, err := m.Block(i); err != nil {
			t.Fatal(err)
		}
	}
	m.RecycleBlock(0) // the last block is unread: both keep their memory for it
	m.RecycleBlock(1)
	kept := spares()
	if kept == 0 {
		t.Fatal("blocks recycled while a later block is unread kept no memory")
	}
	if _, err := m.Block(last); err != nil { // into one block's memory
		t.Fatal(err)
	}
	if got := spares(); got == 0 || got >= kept {
		t.Fatalf("after the last block's read %d of %d spares are left, want one block's", got, kept)
	}
	m.RecycleBlock(last - 1)
	if got := spares(); got != 0 {
		t.Errorf("%d spares kept after recycling with every later block read, want none", got)
	}
	if m.blocks[last-1] != nil {
		t.Errorf("block %d was not released", last-1)
	}
}
