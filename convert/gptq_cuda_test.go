package convert

import (
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
)

// TestGPUCPUSolvedGPTQ: GPTQ with --imatrix or --clip on --device cuda solves on the GPU
// (the searched group fits included); GPTQ on NF4 and on k-quants gathers the Hessians on the
// GPU and solves on the CPU; RTN with --imatrix searches on the GPU and encodes on the CPU. Each output's
// activation-weighted error matches the all-CPU conversion's (TF32 activations, so not bit for
// bit) within 3% on every linear of tiny.
func TestGPUCPUSolvedGPTQ(t *testing.T) {
	gputest.Open(t) // skips without a GPU
	for _, c := range []struct {
		method        Method
		s             quant.Scheme
		imatrix, clip bool
		where         string
	}{
		{"gptq", quant.Scheme{Bits: 3, GroupSize: 64}, true, false, "on cuda: relative loss"},
		{"gptq", quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}, false, true, "on cuda: relative loss"},
		{"gptq", quant.Scheme{Grid: quant.NF4, Bits: 4, GroupSize: 64, Sym: true}, false, false, "on cpu (Hessians on cuda)"},
		{"gptq", q3k, true, false, "on cpu (Hessians on cuda)"},
		{"rtn", quant.Scheme{Bits: 3, GroupSize: 64}, true, false, "on cuda (search) and cpu"},
	} {
		name := c.method.String() + "/" + c.s.String()
		if c.imatrix {
			name += "/imatrix"
		}
		if c.clip {
			name += "/clip"
		}
		t.Run(name, func(t *testing.T) { checkAgainstCPU(t, c.method, c.s, c.imatrix, c.clip, c.where) })
	}
}

func checkAgainstCPU(t *testing.T, method Method, s quant.Scheme, imatrix, clip bool, where string) {
	tiny := testenv.Testdata(t, "models/tiny")
	opt := DefaultOptions()
	opt.Method, opt.Alloc, opt.Format, opt.Imatrix, opt.Clip = method, Uniform(s), "qpack", imatrix, clip
	opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 8, SeqLen: 128}
	gpuDir, cpuDir, log := convertOnBoth(t, tiny, opt)
	if n := strings.Count(log, where); n < 28 { // one per linear, two for GPTQ's
		t.Errorf("%d log lines say %q, want one per linear (28):\n%s", n, where, log)
	}
	if strings.HasPrefix(where, "on cuda:") && strings.Contains(log, "on cpu") {
		t.Errorf("some linears ran on the CPU:\n%s", log)
	}
	compareWeightedErrors(t, tiny, opt, gpuDir, cpuDir, 0.03, 28)
}
