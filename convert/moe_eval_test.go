package convert

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/evaluate"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
)

// TestSharedTinyMoEFloors checks issue 24's floors on the trained Qwen3-MoE tiny-moe with
// 128 × 512 calibration tokens of calib.txt, perplexity over the 64 × 512 held-out tokens:
// GPTQ int4-g128 and int3-g128 (asymmetric, as the shared models' reference table; every expert
// from its routed tokens) each remove at least 30% of RTN's excess over the unquantized model at
// the same scheme, and budget plans (GPTQ, format qpack, its default ladder) at 3.5 and 4.5 bits
// per weight beat uniform GPTQ int3 and int4, at no more bits than their targets. docs/moe.md
// records the measured values (and why symmetric grids are not the floors' scheme).
//
// GPTQ's share is the mean over the two disjoint 128 × 512 windows calib.txt holds (its first
// tokens, and those of its second half): on one window it moves by a few points with the
// rounding alone (int3: 24–31% over neighbouring calibration sizes with one arithmetic, 25–33%
// with another that computes the same values; docs/moe.md), more than the floor's margin.
// Needs QPACK_EVAL=1 and ../shared (eight conversions and nine evaluations, minutes on 2 cores).
func TestSharedTinyMoEFloors(t *testing.T) {
	if testing.Short() || os.Getenv("QPACK_EVAL") != "1" {
		t.Skip("set QPACK_EVAL=1 (and no -short) for the tiny-moe quality floors")
	}
	src := testenv.Shared(t, "models/tiny-moe")
	calib := testenv.Shared(t, "models/calib.txt")
	heldout := filepath.Join(src, "heldout_ids.npy")
	perplexity := func(dir string) float64 {
		t.Helper()
		ev, err := evaluate.Run(dir, evaluate.Options{Data: heldout, Device: DeviceCPU})
		if err != nil {
			t.Fatal(err)
		}
		return ev.Perplexity
	}
	text, err := os.ReadFile(calib)
	if err != nil {
		t.Fatal(err)
	}
	secondHalf := filepath.Join(t.TempDir(), "calib-second-half.txt")
	if err := os.WriteFile(secondHalf, text[len(text)/2:], 0o644); err != nil {
		t.Fatal(err)
	}
	convertOn := func(calib string, opt Options) (ppl, bpw float64) {
		t.Helper()
		opt.Device, opt.InputHash = DeviceCPU, HashNone
		if opt.Method.Calibrates() {
			opt.Calib = CalibOptions{File: calib, Samples: 128, SeqLen: 512}
		}
		dst := filepath.Join(t.TempDir(), "q")
		r, err := Convert(src, dst, opt)
		if err != nil {
			t.Fatal(err)
		}
		return perplexity(dst), r.QuantBPW
	}
	convert := func(opt Options) (ppl, bpw float64) { return convertOn(calib, opt) }
	fp := perplexity(src)
	t.Logf("unquantized: perplexity %.4f", fp)
	uniform := map[int]float64{}
	for _, bits := range []int{4, 3} {
		s := quant.Scheme{Bits: bits, GroupSize: 128}
		opt := DefaultOptions()
		opt.Alloc = Uniform(s)
		rtn, _ := convert(opt)
		opt = GPTQ.DefaultOptions()
		opt.Alloc = Uniform(s)
		gptq, bpw := convert(opt)
		second, _ := convertOn(secondHalf, opt)
		removed := ((rtn - gptq) + (rtn - second)) / 2 / (rtn - fp)
		t.Logf("%s: RTN %.4f, GPTQ %.4f (calib.txt's second half: %.4f) at %.3f bits/weight: %.1f%% of RTN's excess removed (%.1f%%, %.1f%%)",
			s, rtn, gptq, second, bpw, 100*removed, 100*(rtn-gptq)/(rtn-fp), 100*(rtn-second)/(rtn-fp))
		if removed < 0.30 {
			t.Errorf("%s: GPTQ removes %.1f%% of RTN's excess over the unquantized model; want at least 30%%", s, 100*removed)
		}
		uniform[bits] = gptq
	}
	for _, c := range []struct {
		bpw  float64
		bits int
	}{{3.5, 3}, {4.5, 4}} {
		opt := GPTQ.DefaultOptions()
		opt.Format = "qpack"
		opt.Alloc = alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: c.bpw}
		ppl, bpw := convert(opt)
		t.Logf("GPTQ budget %g: perplexity %.4f at %.3f bits/weight (uniform GPTQ int%d: %.4f)", c.bpw, ppl, bpw, c.bits, uniform[c.bits])
		if bpw > c.bpw || ppl >= uniform[c.bits] {
			t.Errorf("budget %g: perplexity %.4f at %.3f bits/weight; want below uniform GPTQ int%d's %.4f within the budget", c.bpw, ppl, bpw, c.bits, uniform[c.bits])
		}
	}
}
