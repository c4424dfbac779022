package convert

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/evaluate"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/internal/moetest"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
	"github.com/qpack-dev/qpack/safetensors"
)

// TestGPUExperts: GPTQ (routed, weighted and every-token calibration of the experts) and AWQ of
// the tiny model made a Qwen2-MoE on --device cuda: the forward passes, routing and per-expert
// Hessians on the GPU give, linear by linear, the activation-weighted errors of the all-CPU
// conversion within 5%, and the two models' perplexities agree within 5% (measured: within 3.2%;
// the int4 errors of this 1.3 M-parameter model at perplexity 130 move it by percents when each
// linear's error moves by one or two; a broken path is far off). The GPU calibrates in
// float32 here, not TF32: with TF32 a token whose router logits nearly tie changes experts, and on
// this small model (1,024 calibration tokens) that alone moved errors by up to 20% either way.
func TestGPUExperts(t *testing.T) {
	gputest.Open(t) // skips without a GPU
	calibrationRounds = false
	t.Cleanup(func() { calibrationRounds = true })
	tiny := testenv.Testdata(t, "models/tiny")
	src := moetest.FromDense(t, tiny, "qwen2_moe", nil)
	for _, c := range []struct {
		name    string
		method  Method
		experts ExpertOptions
	}{
		{"gptq/routed", GPTQ, ExpertOptions{}}, {"gptq/weighted", GPTQ, ExpertOptions{RoutingWeighted: true}},
		{"gptq/all", GPTQ, ExpertOptions{AllTokens: true}}, {"awq", AWQ, ExpertOptions{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			opt := c.method.DefaultOptions()
			opt.Alloc, opt.Format, opt.Experts = Uniform(quant.Scheme{Bits: 4, GroupSize: 32, Sym: true}), "qpack", c.experts
			opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 8, SeqLen: 128}
			opt.InputHash = HashNone
			gpuDir, cpuDir, log := convertOnBoth(t, src, opt)
			if !strings.Contains(log, "block 3: calibration tokens routed to experts 0-3:") || !strings.Contains(log, "on cuda") {
				t.Errorf("log:\n%s", log)
			}
			compareWeightedErrors(t, src, opt, gpuDir, cpuDir, 0.05, 4*(4+3*4+3)) // attention, 4 experts, the shared expert
			ids := filepath.Join(tiny, "heldout_ids.npy")
			var ppl [2]float64
			for i, dir := range []string{gpuDir, cpuDir} {
				ev, err := evaluate.Run(dir, evaluate.Options{Data: ids, MaxSeqs: 2, Device: DeviceCPU})
				if err != nil {
					t.Fatal(err)
				}
				ppl[i] = ev.Perplexity
			}
			if !(ppl[0] < 1.05*ppl[1] && ppl[1] < 1.05*ppl[0]) {
				t.Errorf("perplexity %.4f after the GPU conversion, %.4f after the CPU's", ppl[0], ppl[1])
			}
		})
	}
}

// TestGPUExpertsOnSeveralGPUs: GPTQ of the tiny model made a Qwen2-MoE, calibrated on two and
// three GPUs (several handles on GPU 0 where the machine has fewer; routed, weighted and
// every-token calibration of the experts, true-sequential or every group at once, some experts
// below --moe-min-tokens) — each GPU routing its share of the sequences, the experts' Hessians
// and routed-token counts summed over the GPUs — matches the one-GPU conversion's
// activation-weighted error within 3% on every linear, counts every routed token (the counts
// logged add up to tokens × top-k, each within 8% of one GPU's: after the first block the
// quantized weights, and so a few near-tied routings, differ), and gives the same bytes when run
// again.
func TestGPUExpertsOnSeveralGPUs(t *testing.T) {
	gputest.Open(t)           // skips without a GPU
	calibrationRounds = false // as TestGPUExperts: float32 keeps near-tied routers apart
	t.Cleanup(func() { calibrationRounds = true })
	tiny := testenv.Testdata(t, "models/tiny")
	src := moetest.FromDense(t, tiny, "qwen2_moe", nil)
	for _, c := range []struct {
		name    string
		experts ExpertOptions
		trueSeq bool
	}{
		{"routed", ExpertOptions{MinTokens: 450}, true}, {"weighted", ExpertOptions{RoutingWeighted: true}, true},
		{"all", ExpertOptions{AllTokens: true}, true}, {"routed/all-groups-at-once", ExpertOptions{MinTokens: 450}, false},
	} {
		opt := GPTQ.DefaultOptions()
		opt.Alloc, opt.Format, opt.Experts, opt.Device = Uniform(quant.Scheme{Bits: 4, GroupSize: 32, Sym: true}), "qpack", c.experts, DeviceCUDA
		opt.GPTQ.TrueSequential = c.trueSeq
		opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 8, SeqLen: 128}
		opt.InputHash = HashNone
		dir := t.TempDir()
		convertOn := func(name string, gpus int) (string, string) { return convertOnGPUs(t, src, opt, dir, name, gpus) }
		one, oneLog := convertOn("one", 1)
		for _, gpus := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/gpus=%d", c.name, gpus), func(t *testing.T) {
				out, log := convertOn(fmt.Sprintf("gpus%d", gpus), gpus)
				if want := fmt.Sprintf("gptq on %d × ", gpus); !strings.Contains(log, want) {
					t.Errorf("the log does not say %q:\n%s", want, log)
				}
				compareRouting(t, routedCounts(t, log), routedCounts(t, oneLog), 8*128*2, 0.08)
				compareWeightedErrors(t, src, opt, out, one, 0.03, 4*(4+3*4+3))
				again, _ := convertOn(fmt.Sprintf("gpus%d-again", gpus), gpus)
				sameFiles(t, again, out)
			})
		}
	}
}

// routedCounts reads the tokens routed to each expert of each block from a conversion's log.
func routedCounts(t *testing.T, log string) [][]int {
	var blocks [][]int
	for _, l := range strings.Split(log, "\n") {
		_, after, ok := strings.Cut(l, "calibration tokens routed to experts ")
		if !ok {
			continue
		}
		fields := strings.Fields(after)
		var counts []int
		for _, f := range fields[1:] {
			n, err := strconv.Atoi(f)
			if err != nil {
				break // "(1024"
			}
			counts = append(counts, n)
		}
		blocks = append(blocks, counts)
	}
	if len(blocks) == 0 {
		t.Fatalf("no routing in the log:\n%s", log)
	}
	return blocks
}

// compareRouting wants every block's counts to add up to slots and each to be within tol of
// want's, relative, or 16 tokens.
func compareRouting(t *testing.T, got, want [][]int, slots int, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("routing of %d blocks logged, want %d", len(got), len(want))
	}
	for b := range got {
		sum := 0
		for e, n := range got[b] {
			sum += n
			if d := math.Abs(float64(n - want[b][e])); d > max(16, tol*float64(want[b][e])) {
				t.Errorf("block %d, expert %d: %d tokens routed, %d on one GPU", b, e, n, want[b][e])
			}
		}
		if sum != slots {
			t.Errorf("block %d: %d tokens routed in all (%v), want %d", b, sum, got[b], slots)
		}
	}
}

// compareWeightedErrors wants the activation-weighted relative error of each of the want
// quantized linears of src in gpuDir within tol (relative) of cpuDir's.
func compareWeightedErrors(t *testing.T, src string, opt Options, gpuDir, cpuDir string, tol float64, want int) {
	t.Helper()
	calib, err := opt.calibration(src)
	if err != nil {
		t.Fatal(err)
	}
	imp, _, err := measureImportance(context.Background(), src, calib, DeviceCPU, nil, "", opt.Experts, func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	gc, err := quantized.Open(gpuDir)
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	cc, err := quantized.Open(cpuDir)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	in, err := safetensors.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	compared := 0
	for _, name := range in.Names() {
		tn := model.ParseTensorName(name)
		v, ok := imp[tn.Module]
		if !ok || tn.Param != "weight" || !tn.Role.IsLinear() {
			continue
		}
		info, _ := in.Info(name)
		w, _ := in.Float32(name)
		gw, err := gc.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		cw, _ := cc.Float32(name)
		eg := quant.WeightedRelativeError(w, gw, info.Shape[0], info.Shape[1], v)
		ec := quant.WeightedRelativeError(w, cw, info.Shape[0], info.Shape[1], v)
		if !(eg <= (1+tol)*ec && ec <= (1+tol)*eg) {
			t.Errorf("%s: weighted error %.4g after the GPU conversion, %.4g after the CPU's", name, eg, ec)
		}
		compared++
	}
	if compared != want {
		t.Errorf("compared %d linears, want %d", compared, want)
	}
}
