package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// recorder keeps a copy of every observed input and applies replace (when set) in Update.
type recorder struct {
	inputs  map[string][]float32 // "block/group/seq" → x
	seen    map[string]int       // "block/group" → sequences seen
	replace func(b *Block, groups []Group) error
}

func newRecorder() *recorder {
	return &recorder{inputs: map[string][]float32{}, seen: map[string]int{}}
}

func (r *recorder) Observe(block int, g Group, x []float32, rows, cols int) error {
	if len(x) != rows*cols {
		return fmt.Errorf("x has %d values for %d×%d", len(x), rows, cols)
	}
	key := fmt.Sprintf("%d/%s", block, g)
	r.inputs[fmt.Sprintf("%s/%d", key, r.seen[key])] = slices.Clone(x)
	r.seen[key]++
	return nil
}

func (r *recorder) Update(b *Block, groups []Group) error {
	if r.replace == nil {
		return nil
	}
	return r.replace(b, groups)
}

func (r *recorder) input(t *testing.T, block int, g Group, seq int) []float32 {
	t.Helper()
	x, ok := r.inputs[fmt.Sprintf("%d/%s/%d", block, g, seq)]
	if !ok {
		t.Fatalf("no input recorded for block %d, %s, sequence %d", block, g, seq)
	}
	return x
}

func calibrationSeqs(t *testing.T, n, length int) [][]int {
	ids := heldoutIDs(t, tinyDir)
	seqs, err := Sequences(ids[1000:], length, n)
	if err != nil {
		t.Fatal(err)
	}
	return seqs
}

// naiveLinear is y = x·Wᵀ + b summed in float64, independent of matMulT.
func naiveLinear(x []float32, l *Linear, rows int) []float32 {
	y := make([]float32, rows*l.Out)
	for r := range rows {
		for o := range l.Out {
			var s float64
			for i := range l.In {
				s += float64(x[r*l.In+i]) * float64(l.W[o*l.In+i])
			}
			if l.Bias != nil {
				s += float64(l.Bias[o])
			}
			y[r*l.Out+o] = float32(s)
		}
	}
	return y
}

// naiveAttention is causal GQA attention in float64 on rotated q, k.
func naiveAttention(q, k, v []float32, T int, c *Config) []float32 {
	out := make([]float32, T*c.Heads*c.HeadDim)
	d := c.HeadDim
	for h := range c.Heads {
		kh := h / (c.Heads / c.KVHeads)
		for t := range T {
			w := make([]float64, t+1)
			var sum float64
			for j := range w {
				var s float64
				for i := range d {
					s += float64(q[(t*c.Heads+h)*d+i]) * float64(k[(j*c.KVHeads+kh)*d+i])
				}
				w[j] = math.Exp(s / math.Sqrt(float64(d)))
				sum += w[j]
			}
			for i := range d {
				var s float64
				for j := range w {
					s += w[j] / sum * float64(v[(j*c.KVHeads+kh)*d+i])
				}
				out[(t*c.Heads+h)*d+i] = float32(s)
			}
		}
	}
	return out
}

func assertClose(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var scale, diff float64
	for i := range want {
		scale = max(scale, math.Abs(float64(want[i])))
		diff = max(diff, math.Abs(float64(got[i]-want[i])))
	}
	if diff > tol*max(scale, 1) {
		t.Errorf("%s: max |diff| %g exceeds %g × max(|want|=%g, 1)", what, diff, tol, scale)
	}
}

// TestCaptureReproducesBlock checks that the captured inputs, pushed through the block's
// weights by independent float64 code, reproduce every internal projection and the output.
func TestCaptureReproducesBlock(t *testing.T) {
	m := openModel(t, tinyDir)
	seqs := calibrationSeqs(t, 2, 40)
	rec := newRecorder()
	if err := Calibrate(m, seqs, rec, CalibrateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := m.Config
	for s, seq := range seqs {
		T := len(seq)
		x, err := m.Embedding(seq)
		if err != nil {
			t.Fatal(err)
		}
		for i := range c.Layers {
			b, _ := m.Block(i)
			where := func(what string) string { return fmt.Sprintf("block %d seq %d: %s", i, s, what) }
			xqkv, xo := rec.input(t, i, GroupQKV, s), rec.input(t, i, GroupO, s)
			xgu, xdown := rec.input(t, i, GroupGateUp, s), rec.input(t, i, GroupDown, s)

			normed := make([]float32, len(x))
			rmsNorm(normed, x, b.InputNorm, T, c.Hidden, c.RMSNormEps)
			assertClose(t, where("qkv input"), xqkv, normed, 1e-5)

			q, k, v := naiveLinear(xqkv, b.Q, T), naiveLinear(xqkv, b.K, T), naiveLinear(xqkv, b.V, T)
			cos, sin := b.rope.get(T)
			applyRope(q, cos, sin, T, c.Heads, c.HeadDim)
			applyRope(k, cos, sin, T, c.KVHeads, c.HeadDim)
			assertClose(t, where("o input = attention(q, k, v)"), xo, naiveAttention(q, k, v, T, c), 1e-4)

			mid := slices.Clone(x)
			addTo(mid, naiveLinear(xo, b.O, T))
			rmsNorm(normed, mid, b.PostAttnNorm, T, c.Hidden, c.RMSNormEps)
			assertClose(t, where("gate/up input"), xgu, normed, 1e-4)

			act := naiveLinear(xgu, b.Gate, T)
			siluMul(act, naiveLinear(xgu, b.Up, T))
			assertClose(t, where("down input = silu(gate)·up"), xdown, act, 1e-4)

			addTo(mid, naiveLinear(xdown, b.Down, T))
			if err := b.Forward(x, T, nil); err != nil {
				t.Fatal(err)
			}
			assertClose(t, where("block output"), x, mid, 1e-4)
		}
	}
}

// setAll replaces every linear of the groups with fill(l).
func setAll(b *Block, groups []Group, fill func(l *Linear) []float32) error {
	for _, g := range groups {
		for _, l := range b.Linears(g) {
			if err := l.SetWeight(fill(l)); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyWeights(l *Linear) []float32 { return slices.Clone(l.W) }
func zeroWeights(l *Linear) []float32 { return make([]float32, len(l.W)) }

func TestCalibrateIdentityReplacementChangesNothing(t *testing.T) {
	ids := calibrationSeqs(t, 1, 64)[0]
	want, err := openModel(t, tinyDir).Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	for _, trueSeq := range []bool{false, true} {
		m := openModel(t, tinyDir)
		rec := newRecorder()
		var updates int
		rec.replace = func(b *Block, groups []Group) error {
			updates++
			return setAll(b, groups, copyWeights)
		}
		if err := Calibrate(m, calibrationSeqs(t, 2, 32), rec, CalibrateOptions{TrueSequential: trueSeq}); err != nil {
			t.Fatal(err)
		}
		wantUpdates := m.Config.Layers
		if trueSeq {
			wantUpdates *= len(Groups)
		}
		if updates != wantUpdates {
			t.Errorf("true-sequential %v: %d updates, want %d", trueSeq, updates, wantUpdates)
		}
		got, err := m.Logits(ids)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("true-sequential %v: logits changed after replacing weights with identical ones", trueSeq)
		}
	}
}

// TestCalibrateZeroBlockPropagates zeroes block 1's linears: block 1 then only passes its input
// through the residuals, so block 2 must see rmsNorm(block 1's input), not the original input.
func TestCalibrateZeroBlockPropagates(t *testing.T) {
	seqs := calibrationSeqs(t, 2, 32)
	run := func(fill func(*Linear) []float32) *recorder {
		rec := newRecorder()
		rec.replace = func(b *Block, groups []Group) error {
			if b.Index != 1 {
				return nil
			}
			return setAll(b, groups, fill)
		}
		if err := Calibrate(openModel(t, tinyDir), seqs, rec, CalibrateOptions{}); err != nil {
			t.Fatal(err)
		}
		return rec
	}
	same, zero := run(copyWeights), run(zeroWeights)
	ref := openModel(t, tinyDir)
	b0, _ := ref.Block(0)
	b2, _ := ref.Block(2)
	for s, seq := range seqs {
		for _, g := range Groups {
			for blk := range 2 { // upstream of the replacement, and block 1's own inputs
				if !slices.Equal(same.input(t, blk, g, s), zero.input(t, blk, g, s)) {
					t.Errorf("block %d %s input changed by zeroing block 1's weights", blk, g)
				}
			}
		}
		if slices.Equal(same.input(t, 2, GroupQKV, s), zero.input(t, 2, GroupQKV, s)) {
			t.Errorf("seq %d: block 2's input did not change when block 1's weights were zeroed", s)
		}
		x, _ := ref.Embedding(seq)
		if err := b0.Forward(x, len(seq), nil); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, len(x))
		rmsNorm(want, x, b2.InputNorm, len(seq), ref.Config.Hidden, ref.Config.RMSNormEps)
		assertClose(t, "block 2 input after zeroed block 1", zero.input(t, 2, GroupQKV, s), want, 1e-6)
	}
}

// TestCalibrateTrueSequential zeroes v_proj in the qkv step: with true-sequential the o_proj
// input observed next must already be zero (attention over zero values).
func TestCalibrateTrueSequential(t *testing.T) {
	seqs := calibrationSeqs(t, 1, 16)
	for _, trueSeq := range []bool{false, true} {
		rec := newRecorder()
		rec.replace = func(b *Block, groups []Group) error {
			if b.Index == 0 && slices.Contains(groups, GroupQKV) {
				return b.V.SetWeight(zeroWeights(b.V))
			}
			return nil
		}
		if err := Calibrate(openModel(t, tinyDir), seqs, rec, CalibrateOptions{TrueSequential: trueSeq}); err != nil {
			t.Fatal(err)
		}
		allZero := !slices.ContainsFunc(rec.input(t, 0, GroupO, 0), func(v float32) bool { return v != 0 })
		if allZero != trueSeq {
			t.Errorf("true-sequential %v: o_proj input all zero = %v", trueSeq, allZero)
		}
	}
}

func TestCalibrateErrors(t *testing.T) {
	m := openModel(t, tinyDir)
	rec := newRecorder()
	rec.replace = func(b *Block, groups []Group) error { return b.Q.SetWeight(make([]float32, 3)) }
	err := Calibrate(m, calibrationSeqs(t, 1, 8), rec, CalibrateOptions{})
	if err == nil {
		t.Fatal("a wrongly sized replacement weight was accepted")
	}
	t.Log(err)
	if err := Calibrate(m, [][]int{{1, 99999}}, newRecorder(), CalibrateOptions{}); err == nil {
		t.Error("an out-of-vocabulary token id was accepted")
	}
}

// ReleaseBlocks leaves no block resident after calibration, and a later use reads the
// original weights back.
func TestCalibrateReleasesBlocks(t *testing.T) {
	m := openModel(t, tinyDir)
	seqs := [][]int{{1, 2, 3, 4, 5, 6, 7, 8}}
	if err := Calibrate(m, seqs, zeroingCalibrator{}, CalibrateOptions{ReleaseBlocks: true}); err != nil {
		t.Fatal(err)
	}
	for i, b := range m.blocks {
		if b != nil {
			t.Fatalf("block %d still resident", i)
		}
	}
	b, err := m.Block(0)
	if err != nil {
		t.Fatal(err)
	}
	nonzero := false
	for _, v := range b.Q.W {
		nonzero = nonzero || v != 0
	}
	if !nonzero {
		t.Errorf("block 0 came back with the replaced (zeroed) weights")
	}
}

// zeroingCalibrator replaces every linear with zeros.
type zeroingCalibrator struct{}

func (zeroingCalibrator) Observe(int, Group, []float32, int, int) error { return nil }
func (zeroingCalibrator) Update(b *Block, groups []Group) error {
	for _, g := range groups {
		for _, l := range b.Linears(g) {
			if err := l.SetWeight(make([]float32, l.Out*l.In)); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestCalibrateObserveOnly: the single observing pass per block sees exactly the inputs of the
// two-pass calibration, and Update runs once per block with every group.
func TestCalibrateObserveOnly(t *testing.T) {
	seqs := calibrationSeqs(t, 3, 32)
	twoPass, onePass := newRecorder(), newRecorder()
	if err := Calibrate(openModel(t, tinyDir), seqs, twoPass, CalibrateOptions{}); err != nil {
		t.Fatal(err)
	}
	var updates int
	onePass.replace = func(b *Block, groups []Group) error {
		updates++
		if !slices.Equal(groups, Groups) {
			t.Errorf("block %d: Update with %v, want every group", b.Index, groups)
		}
		return nil
	}
	m := openModel(t, tinyDir)
	if err := Calibrate(m, seqs, onePass, CalibrateOptions{ObserveOnly: true, ReleaseBlocks: true}); err != nil {
		t.Fatal(err)
	}
	if updates != m.Config.Layers {
		t.Errorf("%d updates, want one per block (%d)", updates, m.Config.Layers)
	}
	if len(onePass.inputs) != len(twoPass.inputs) {
		t.Fatalf("observed %d inputs, want %d", len(onePass.inputs), len(twoPass.inputs))
	}
	for key, want := range twoPass.inputs {
		if !slices.Equal(onePass.inputs[key], want) {
			t.Fatalf("%s: the observing pass saw a different input", key)
		}
	}
}

// scalingCalibrator scales every updated linear by 0.9, so each step's replacement shows in
// what later steps and blocks observe.
func scalingCalibrator() *recorder {
	rec := newRecorder()
	rec.replace = func(b *Block, groups []Group) error {
		return setAll(b, groups, func(l *Linear) []float32 {
			w := slices.Clone(l.W)
			for i := range w {
				w[i] *= 0.9
			}
			return w
		})
	}
	return rec
}

// TestCalibrateReusesAttention: true-sequential calibration, which runs the attention half of
// a block once for its MLP steps, observes exactly what running every step's pass through the
// whole block observes, for a dense model and a mixture of experts.
func TestCalibrateReusesAttention(t *testing.T) {
	for _, js := range []string{gpuTestConfigs[0].json, moeTestConfigs[1].json} {
		cfg := mustConfig(t, js)
		r := rand.New(rand.NewPCG(6, 6))
		w := randomWeights(cfg, false, true, r)
		seqs := [][]int{randomIDs(r, 17, cfg.Vocab), randomIDs(r, 17, cfg.Vocab)}
		got, want := scalingCalibrator(), scalingCalibrator()
		m, _ := Load(cfg, w)
		if err := Calibrate(m, seqs, got, CalibrateOptions{TrueSequential: true}); err != nil {
			t.Fatal(err)
		}
		ref, _ := Load(cfg, w)
		hidden := make([][]float32, len(seqs))
		for s, seq := range seqs {
			hidden[s], _ = ref.Embedding(seq)
		}
		for i := range cfg.Layers {
			b, _ := ref.Block(i)
			for _, step := range b.Stages() {
				if err := observeStep(b, seqs, hidden, want, step, func(s int, x []float32, hook Hook) error { return b.Forward(x, len(seqs[s]), hook) }); err != nil {
					t.Fatal(err)
				}
				if err := want.Update(b, step); err != nil {
					t.Fatal(err)
				}
			}
			for s, seq := range seqs {
				if err := b.Forward(hidden[s], len(seq), nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		if len(got.inputs) != len(want.inputs) {
			t.Fatalf("%s: %d inputs observed, want %d", cfg.ModelType, len(got.inputs), len(want.inputs))
		}
		for key, x := range want.inputs {
			if !slices.Equal(got.inputs[key], x) {
				t.Errorf("%s: %s observed differently", cfg.ModelType, key)
			}
		}
	}
}
