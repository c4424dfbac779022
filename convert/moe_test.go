package convert

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/evaluate"
	"github.com/qpack-dev/qpack/internal/moetest"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
)

// moeConvert converts the tiny model made a mixture of experts of family with opt (calibrated
// on 4 × 128 tokens of tiny's held-out text when the method calibrates) and returns the output
// and the log.
func moeConvert(t *testing.T, src string, opt Options) (string, string) {
	t.Helper()
	if opt.Method.Calibrates() {
		opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 4, SeqLen: 128}
	}
	var log bytes.Buffer
	opt.Log, opt.InputHash, opt.Device = &log, HashNone, DeviceCPU
	dst := filepath.Join(t.TempDir(), "q")
	if _, err := Convert(src, dst, opt); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	return dst, log.String()
}

// expertWeights returns the dequantized weight of an expert's projection.
func expertWeights(t *testing.T, dir, name string) []float32 {
	t.Helper()
	c, err := quantized.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := c.Float32(name)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestGPTQExperts: GPTQ quantizes every expert from its own calibration inputs, logs the tokens
// routed to each, falls back to every token's inputs below --moe-min-tokens (and for all of them
// under --moe-calib all), and each choice gives different weights.
func TestGPTQExperts(t *testing.T) {
	src := moetest.FromDense(t, testenv.Testdata(t, "models/tiny"), "qwen2_moe", nil)
	s := quant.Scheme{Bits: 3, GroupSize: 32, Sym: true}
	run := func(experts ExpertOptions) (string, string) {
		opt := GPTQ.DefaultOptions()
		opt.Alloc, opt.Experts = Uniform(s), experts
		return moeConvert(t, src, opt)
	}
	routed, log := run(ExpertOptions{MinTokens: 1}) // only an expert no token reached would fall back
	if !strings.Contains(log, "gptq block 3: calibration tokens routed to experts 0-3: ") || strings.Contains(log, "below the minimum") {
		t.Errorf("log of the routed calibration:\n%s", log)
	}
	fallback, log := run(ExpertOptions{MinTokens: 1 << 20})
	if !strings.Contains(log, "gptq block 0: expert 0 (") || !strings.Contains(log, "below the minimum of 1048576: calibrated on all 512 tokens instead") {
		t.Errorf("log of the fallback:\n%s", log)
	}
	all, log := run(ExpertOptions{AllTokens: true})
	if !strings.Contains(log, "every expert calibrated on all 512 tokens (--moe-calib all)") {
		t.Errorf("log of --moe-calib all:\n%s", log)
	}
	weighted, _ := run(ExpertOptions{MinTokens: 1, RoutingWeighted: true})
	rtnOpt := DefaultOptions()
	rtnOpt.Alloc = Uniform(s)
	rtn, _ := moeConvert(t, src, rtnOpt)
	for _, name := range []string{"model.layers.1.mlp.experts.2.gate_proj.weight", "model.layers.1.mlp.experts.2.down_proj.weight"} {
		w := map[string][]float32{}
		for run, dir := range map[string]string{"routed": routed, "fallback": fallback, "all": all, "weighted": weighted, "rtn": rtn} {
			w[run] = expertWeights(t, dir, name)
		}
		for _, pair := range [][2]string{{"routed", "rtn"}, {"routed", "all"}, {"routed", "weighted"}} {
			if slices.Equal(w[pair[0]], w[pair[1]]) {
				t.Errorf("%s: %s and %s give the same weights", name, pair[0], pair[1])
			}
		}
		// Every expert below the minimum is calibrated on every token: as --moe-calib all.
		if !slices.Equal(w["fallback"], w["all"]) {
			t.Errorf("%s: every expert falling back differs from --moe-calib all", name)
		}
	}
}

// TestAWQExperts: AWQ folds the post-attention norm's scale into the router, the shared expert's
// gate and every expert's gate/up, and each up's into its expert's down; the folded router and
// shared gate, kept unquantized, are written as folded, so at 8 bits the model computes what
// the source does.
func TestAWQExperts(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	src := moetest.FromDense(t, tiny, "qwen2_moe", nil)
	opt := AWQ.DefaultOptions()
	opt.Alloc = Uniform(quant.Scheme{Bits: 8, GroupSize: 32, Sym: true})
	opt.AWQ.SearchTokens = 128
	dst, log := moeConvert(t, src, opt)
	if !strings.Contains(log, "awq block 2 expert3.down: α") || !strings.Contains(log, "awq block 2 gate_up: α") {
		t.Errorf("log:\n%s", log)
	}
	for _, name := range []string{"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.shared_expert_gate.weight", "model.layers.1.post_attention_layernorm.weight"} {
		if slices.Equal(expertWeights(t, dst, name), expertWeights(t, src, name)) {
			t.Errorf("%s was not written with the folded scales", name)
		}
	}
	ev, err := evaluate.Run(dst, evaluate.Options{Data: filepath.Join(tiny, "heldout_ids.npy"), Reference: src, MaxSeqs: 2, Device: DeviceCPU})
	if err != nil {
		t.Fatal(err)
	}
	if ev.MeanKL > 2e-3 || ev.Top1Agreement < 0.97 {
		t.Errorf("8-bit AWQ against the source: mean KL %.2g, top-1 agreement %.3f", ev.MeanKL, ev.Top1Agreement)
	}
}
