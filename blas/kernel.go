package blas

// kernel is a micro-kernel and the cache blocking that feeds it: run computes one mr×nr tile
// of C from a packed panel of A (kc steps of mr values) and one of B (kc steps of nr values).
// The driver hands it kc ≤ this.kc steps, A blocks of mc rows (they stay in L2 while the
// panels of B pass by) and B blocks of nc columns.
type kernel struct {
	name       string
	mr, nr     int
	kc, mc, nc int
	simd       bool
	// run writes the tile to c (row stride ldc), or adds it to c when add is set.
	run func(kc int, a, b, c []float32, ldc int, add bool)
}

// portable is the kernel of every CPU: plain Go, 4×4 tiles.
var portable = &kernel{name: "portable Go", mr: 4, nr: 4, kc: 256, mc: 128, nc: 2048, run: kernelGo}

// kernelGo is the portable micro-kernel and the reference of the assembly ones: each output is
// one running sum over the kc steps, in step order.
func kernelGo(kc int, a, b, c []float32, ldc int, add bool) {
	a, b = a[:kc*4], b[:kc*4]
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	for p := 0; p < kc; p++ {
		ap, bp := a[p*4:p*4+4:p*4+4], b[p*4:p*4+4:p*4+4]
		b0, b1, b2, b3 := bp[0], bp[1], bp[2], bp[3]
		a0 := ap[0]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		a1 := ap[1]
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		a2 := ap[2]
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		a3 := ap[3]
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	rows := [4][4]float32{{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}, {c30, c31, c32, c33}}
	for i, row := range rows {
		dst := c[i*ldc : i*ldc+4]
		if add {
			for j, v := range row {
				dst[j] += v
			}
		} else {
			copy(dst, row[:])
		}
	}
}
