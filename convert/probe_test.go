package convert

import (
	"bytes"
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
)

// The output probe on tiny: every decoder linear gets a finite coefficient α > 0; α·e² of the
// probe's own quantization is the KL the whole model shows with that linear quantized (checked
// against model.Compare); the coefficients spread widely (else the probe would change nothing);
// a budget conversion records the probe in its provenance and --output-probe=false skips it.
func TestOutputProbe(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	nop := func(string, ...any) {}
	opt := DefaultOptions()
	opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 4, SeqLen: 128}
	calib, err := opt.calibration(tiny)
	if err != nil {
		t.Fatal(err)
	}
	imp, _, err := measureImportance(context.Background(), tiny, calib, DeviceCPU, nil, "", ExpertOptions{}, nop)
	if err != nil {
		t.Fatal(err)
	}
	alpha, err := outputCoefficients(context.Background(), tiny, calib, imp, DeviceCPU, nil, "", nop)
	if err != nil {
		t.Fatal(err)
	}
	if len(alpha) != 28 {
		t.Fatalf("%d coefficients, want 28 (4 blocks × 7 linears)", len(alpha))
	}
	lo, hi := math.Inf(1), 0.0
	for name, a := range alpha {
		if !(a > 0) || math.IsInf(a, 0) {
			t.Errorf("%s: α = %g", name, a)
		}
		lo, hi = min(lo, a), max(hi, a)
	}
	if hi < 5*lo {
		t.Errorf("coefficients from %g to %g: expected a wide spread", lo, hi)
	}

	var ids []int
	for _, s := range calib.seqs {
		ids = append(ids, s...)
	}
	ref, _ := model.Open(tiny)
	defer ref.Close()
	for _, module := range []string{"model.layers.0.self_attn.q_proj", "model.layers.3.mlp.down_proj"} {
		test, _ := model.Open(tiny)
		parts := model.ParseTensorName(module + ".weight")
		b, _ := test.Block(parts.Block)
		l, err := b.Linear(module[strings.LastIndex(module, ".")+1:])
		if err != nil {
			t.Fatal(err)
		}
		q, _ := blockwise.Quantize(l.W, l.Out, l.In, probeScheme, blockwise.Options{})
		wq := q.Dequantize(nil)
		e := quant.WeightedRelativeError(l.W, wq, l.Out, l.In, imp[module])
		if err := l.SetWeight(wq); err != nil {
			t.Fatal(err)
		}
		c, err := model.Compare(ref, test, ids, calib.SeqLen, len(calib.seqs))
		test.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := alpha[module] * e * e; math.Abs(got-c.MeanKL) > 1e-9*c.MeanKL {
			t.Errorf("%s: α·e² = %g, whole-model KL %g", module, got, c.MeanKL)
		}
	}

	ladder, _ := alloc.ParseLadder("int2-g64-asym,int3-g128-asym,int4-g128-asym,int8-g128-asym")
	opt.Alloc = alloc.Options{Strategy: alloc.StrategyBudget, Ladder: ladder, TargetBPW: 3.5}
	opt.Format, opt.importance = "qpack", imp
	dir := t.TempDir()
	for _, probe := range []bool{true, false} {
		var log bytes.Buffer
		opt.OutputProbe, opt.Log = probe, &log
		out := filepath.Join(dir, map[bool]string{true: "probe", false: "plain"}[probe])
		if _, err := Convert(tiny, out, opt); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(log.String(), "output probe: KL of 28 linears"); got != probe {
			t.Errorf("output probe %v: log says probed %v:\n%s", probe, got, log.String())
		}
		c, err := quantized.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{true: `"output_probe":true`, false: `"output_probe":false`}[probe]
		if !strings.Contains(c.Metadata()[ProvenanceKey], want) {
			t.Errorf("provenance does not record %s", want)
		}
		c.Close()
	}
}

// A deep model probes probeBlocks evenly spaced blocks, edges included, and the blocks between
// take the geometric interpolation of their neighbours' coefficients, linear by linear.
func TestProbedBlocksAndInterpolation(t *testing.T) {
	if got := probedBlocks(6); len(got) != 6 {
		t.Errorf("6 layers: probed %v, want all", got)
	}
	deep := probedBlocks(32)
	if len(deep) != probeBlocks || !deep[0] || !deep[31] {
		t.Errorf("32 layers: probed %v", deep)
	}
	alpha := map[string]float64{
		"model.layers.0.self_attn.q_proj": 1, "model.layers.3.self_attn.q_proj": 8,
		"model.layers.0.mlp.down_proj": 2, "model.layers.3.mlp.down_proj": 2,
		"model.layers.0.mlp.up_proj": 5, // no partner at block 3: left to the median
	}
	interpolateCoefficients(alpha, map[int]bool{0: true, 3: true}, 4)
	for name, want := range map[string]float64{
		"model.layers.1.self_attn.q_proj": 2, "model.layers.2.self_attn.q_proj": 4,
		"model.layers.1.mlp.down_proj": 2, "model.layers.2.mlp.down_proj": 2,
	} {
		if got := alpha[name]; math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: %g, want %g", name, got, want)
		}
	}
	if _, ok := alpha["model.layers.1.mlp.up_proj"]; ok || len(alpha) != 9 {
		t.Errorf("interpolated %d coefficients: %v", len(alpha), alpha)
	}
}
