package convert

import (
	"context"
	"math"
	"testing"

	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/internal/testenv"
)

// TestGPUPlanStatisticsMatchCPU: the plan's per-channel mean x² and mean |x| gathered on the GPU
// (TF32 forward, one observing pass per block) match the CPU's for every linear of tiny.
func TestGPUPlanStatisticsMatchCPU(t *testing.T) {
	gputest.Open(t) // skips without a GPU
	tiny := testenv.Testdata(t, "models/tiny")
	calib, err := loadCalibration(tiny, CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 8, SeqLen: 128})
	if err != nil {
		t.Fatal(err)
	}
	quiet := func(string, ...any) {}
	cpuE, cpuA, err := measureImportance(context.Background(), tiny, calib, DeviceCPU, "", ExpertOptions{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	gpuE, gpuA, err := measureImportance(context.Background(), tiny, calib, DeviceCUDA, "", ExpertOptions{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if len(cpuE) != 28 || len(gpuE) != len(cpuE) || len(gpuA) != len(cpuA) {
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
}
