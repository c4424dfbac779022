package safetensors

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestDecodeFloat32InPieces: a tensor large enough to be decoded on several cores decodes to
// the bits of one decoder call over all of it, for every multi-byte float dtype.
func TestDecodeFloat32InPieces(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, d := range []DType{F16, BF16, F32, F64} {
		n := 3<<20 + 17
		src := make([]byte, n*d.Bits()/8)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		got, want := make([]float32, n), make([]float32, n)
		if err := DecodeFloat32(d, got, src); err != nil {
			t.Fatal(err)
		}
		decoders[d](want, src)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s element %d: %#x, want %#x", d, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
			}
		}
	}
}
