package convert

import (
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// TestGPUIQuantSameBytes: RTN to iq4_nl (tiny's rows are multiples of its block of 32, not of
// 256) on --device cuda fits every linear of tiny on the GPU and writes exactly the files of
// --device cpu, with and without --imatrix.
func TestGPUIQuantSameBytes(t *testing.T) {
	iq4nl, _ := quant.IQuantScheme(quant.IQ4NL)
	checkGPUSameBytes(t, iq4nl)
}
