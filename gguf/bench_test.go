package gguf

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkEncode measures the reference quantizers on a 1024×384 weight (small-llama's
// gate_proj): bytes/s of float32 input.
func BenchmarkEncode(b *testing.B) {
	x := randomRows(rand.New(rand.NewPCG(5, 6)), 1024*384)
	for _, typ := range Encoders {
		b.Run(typ.String(), func(b *testing.B) {
			dst := make([]byte, 0, 4*len(x))
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				var err error
				if dst, err = Encode(dst[:0], typ, x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
