package convert

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/internal/moetest"
	"github.com/qpack-dev/qpack/internal/testenv"
)

// TestGPUPlanStatisticsMatchCPU: the plan's per-channel mean x² and mean |x| gathered on the GPU
// (TF32 forward, one observing pass per block) match the CPU's for every linear of tiny, on one
// GPU and on three (each over its share of the sequences, the sums added up), and for tiny made a
// Qwen2-MoE on three (float32 GEMMs, as the routers' near-ties need; experts fall back to every
// token, decided on all the GPUs' counts).
func TestGPUPlanStatisticsMatchCPU(t *testing.T) {
	gputest.Open(t) // skips without a GPU
	tiny := testenv.Testdata(t, "models/tiny")
	moe := moetest.FromDense(t, tiny, "qwen2_moe", nil)
	calib, err := loadCalibration(tiny, CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 8, SeqLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	experts := ExpertOptions{MinTokens: 450} // tiny's experts get 230–840 of the 2,048 routings of 1,024 tokens: some fall back
	quiet := func(string, ...any) {}
	for _, c := range []struct {
		src     string
		gpus    int
		modules int
	}{{tiny, 1, 28}, {tiny, 3, 28}, {moe, 3, 0}} {
		t.Run(fmt.Sprintf("%s/gpus=%d", filepath.Base(c.src), c.gpus), func(t *testing.T) {
			if c.src == moe {
				calibrationRounds = false
				defer func() { calibrationRounds = true }()
			}
			cpuE, cpuA, err := measureImportance(context.Background(), c.src, calib, DeviceCPU, nil, "", experts, quiet)
			if err != nil {
				t.Fatal(err)
			}
			gpuE, gpuA, err := measureImportance(context.Background(), c.src, calib, DeviceCUDA, gpuOrdinals(t, c.gpus), "", experts, quiet)
			if err != nil {
				t.Fatal(err)
			}
			if c.modules > 0 && len(cpuE) != c.modules || len(gpuE) != len(cpuE) || len(gpuA) != len(cpuA) {
				t.Fatalf("statistics for %d/%d modules on the CPU, %d/%d on the GPU", len(cpuE), len(cpuA), len(gpuE), len(gpuA))
			}
			for _, pair := range []struct {
				name     string
				cpu, gpu map[string][]float32
			}{{"mean x²", cpuE, gpuE}, {"mean |x|", cpuA, gpuA}} {
				for module, want := range pair.cpu {
					got := pair.gpu[module]
					var num, den float64
					for i := range want {
						d := float64(got[i] - want[i])
						num, den = num+d*d, den+float64(want[i])*float64(want[i])
					}
					if rel := math.Sqrt(num / den); !(rel < 3e-3) { // TF32 activations
						t.Errorf("%s of %s: relative difference %.2e", pair.name, module, rel)
					}
				}
			}
		})
	}
}

// TestGPUOutputProbeOnSeveralGPUs: the output probe's coefficients with the probes dealt to three
// GPUs are one GPU's within 1% (the scaled FP16 operands' powers of two follow each GPU's batch)
// and one GPU's are the CPU's within 2%; the coefficients span two orders of magnitude, so a probe
// read from the wrong stream would be far off.
func TestGPUOutputProbeOnSeveralGPUs(t *testing.T) {
	gputest.Open(t) // skips without a GPU
	tiny := testenv.Testdata(t, "models/tiny")
	calib, err := loadCalibration(tiny, CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 4, SeqLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	quiet := func(string, ...any) {}
	imp, _, err := measureImportance(context.Background(), tiny, calib, DeviceCPU, nil, "", ExpertOptions{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	probe := func(device string, gpus int) map[string]float64 {
		alpha, err := outputCoefficients(context.Background(), tiny, calib, imp, device, gpuOrdinals(t, gpus), "", quiet)
		if err != nil {
			t.Fatal(err)
		}
		return alpha
	}
	cpu, one, three := probe(DeviceCPU, 1), probe(DeviceCUDA, 1), probe(DeviceCUDA, 3)
	if len(cpu) != 28 || len(one) != len(cpu) || len(three) != len(cpu) {
		t.Fatalf("%d coefficients on the CPU, %d on one GPU, %d on three", len(cpu), len(one), len(three))
	}
	for name, want := range cpu {
		if a := one[name]; math.Abs(a-want) > 0.02*want {
			t.Errorf("%s: α %g on one GPU, %g on the CPU", name, a, want)
		}
		if a := three[name]; math.Abs(a-one[name]) > 0.01*one[name] {
			t.Errorf("%s: α %g on three GPUs, %g on one", name, a, one[name])
		}
	}
}
