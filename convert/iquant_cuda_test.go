package convert

import (
	"context"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
)

// TestGPUIQuantSameBytes: RTN to iq4_nl (tiny's rows are multiples of its block of 32, not of
// 256) on --device cuda fits every linear of tiny on the GPU and writes exactly the files of
// --device cpu, with and without --imatrix (the importance measured once, on the CPU).
func TestGPUIQuantSameBytes(t *testing.T) {
	gputest.Open(t) // skips without a GPU
	tiny := testenv.Testdata(t, "models/tiny")
	iq4nl, _ := quant.IQuantScheme(quant.IQ4NL)
	for _, imatrix := range []bool{false, true} {
		t.Run(map[bool]string{false: "rtn", true: "rtn-imatrix"}[imatrix], func(t *testing.T) {
			opt := DefaultOptions()
			opt.Alloc, opt.Format, opt.Imatrix = Uniform(iq4nl), "qpack", imatrix
			if imatrix {
				opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 8, SeqLen: 128}
				calib, err := opt.calibration(tiny)
				if err != nil {
					t.Fatal(err)
				}
				if opt.importance, _, err = measureImportance(context.Background(), tiny, calib, DeviceCPU, func(string, ...any) {}); err != nil {
					t.Fatal(err)
				}
			}
			gpuDir, cpuDir, log := convertOnBoth(t, tiny, opt)
			if n := strings.Count(log, " on cuda "); n != 28 || strings.Contains(log, " on cpu ") {
				t.Errorf("%d log lines say \"on cuda\", want every linear's (28):\n%s", n, log)
			}
			sameFiles(t, gpuDir, cpuDir)
		})
	}
}
