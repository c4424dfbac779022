package convert

import (
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
)

// TestGPUFP4SameBytes: RTN to NVFP4 and MXFP4 on --device cuda quantizes every linear of tiny
// with the FP4 kernels (the log says "on cuda" for each) and writes exactly the files of
// --device cpu, in both layouts; in compressed-tensors NVFP4 with the global scales shared by
// q/k/v and gate/up, which the GPU is given.
func TestGPUFP4SameBytes(t *testing.T) {
	gputest.Open(t) // skips without a GPU
	tiny := testenv.Testdata(t, "models/tiny")
	for _, s := range []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme} {
		for _, format := range []string{"compressed-tensors", "qpack"} {
			t.Run(s.String()+"/"+format, func(t *testing.T) {
				opt := DefaultOptions()
				opt.Alloc, opt.Format = Uniform(s), format
				gpuDir, cpuDir, log := convertOnBoth(t, tiny, opt)
				if n := strings.Count(log, " on cuda "); n != 28 || strings.Contains(log, " on cpu ") {
					t.Errorf("%d log lines say \"on cuda\", want every linear's (28):\n%s", n, log)
				}
				sameFiles(t, gpuDir, cpuDir)
			})
		}
	}
}
