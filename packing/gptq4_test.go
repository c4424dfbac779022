package packing

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The AVX2 kernel writes the pure-Go packer's words and returns the same OR of the codes, for
// row counts and lengths around its steps of 8 rows × 64 codes, from any first row, with an
// out-of-range code or without.
func TestPackGPTQ4RowsMatchesGo(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	rng := rand.New(rand.NewPCG(51, 52))
	for _, n := range []int{1, 7, 8, 9, 17, 40} {
		for _, k := range []int{8, 56, 64, 72, 192, 200, 2816} {
			for _, wild := range []bool{false, true} {
				c0 := rng.IntN(n)
				codes := make([]byte, (n-c0)*k)
				for i := range codes {
					codes[i] = byte(rng.IntN(16))
				}
				if wild {
					codes[rng.IntN(len(codes))] = byte(16 + rng.IntN(240))
				}
				got, want := make([]byte, 4*n*k/8), make([]byte, 4*n*k/8)
				for i := range got {
					got[i] = byte(rng.Uint32()) // rows outside [c0, n) keep their bytes
				}
				copy(want, got)
				gotBad, wantBad := packGPTQ4Rows(got, codes, n, k, c0), packGPTQ4Words(want, codes, n, k, c0, 0)
				if !bytes.Equal(got, want) || gotBad != wantBad {
					t.Fatalf("n %d, k %d, rows from %d, wild %v: words differ %v, OR %#x want %#x", n, k, c0, wild, !bytes.Equal(got, want), gotBad, wantBad)
				}
			}
		}
	}
}
