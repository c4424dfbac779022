package gptq

// updateTile is the number of later columns whose slice of U is packed at once: 128×256 float32
// (128 KiB) stays in L2 while every row of the worker passes over it.
const updateTile = 256

// trailingUpdate pushes one block's errors to the columns after it, for rows [lo, hi):
// W[r, i2:] −= E[r, :] · U[i1:i2, i2:], with E[r, b] = errs[(r−lo)·bs + b]. packed (scratch,
// bs·updateTile) holds one tile of U at a time, rearranged so that the kernel reads it in order.
// Sums are float32, like the reference's matmul.
func trailingUpdate(w []float32, k, lo, hi int, errs []float32, bs int, u []float32, i1, i2 int, packed []float32) {
	count := i2 - i1
	for j0 := i2; j0 < k; j0 += updateTile {
		j1 := min(j0+updateTile, k)
		p := packTile(packed, u, k, i1, i2, j0, j1)
		r := lo
		for ; r+2 <= hi; r += 2 {
			e0 := errs[(r-lo)*bs : (r-lo)*bs+count]
			e1 := errs[(r+1-lo)*bs : (r+1-lo)*bs+count]
			updateRowPair(w[r*k+j0:r*k+j1], w[(r+1)*k+j0:(r+1)*k+j1], e0, e1, p)
		}
		if r < hi {
			e := errs[(r-lo)*bs : (r-lo)*bs+count]
			updateRowPair(w[r*k+j0:r*k+j1], nil, e, e, p)
		}
	}
}

// packTile copies U[i1:i2, j0:j1] into dst in groups of four columns: for each group, the
// rows one after another, four values each (a last group of fewer columns is zero-padded).
func packTile(dst, u []float32, k, i1, i2, j0, j1 int) []float32 {
	count, quads := i2-i1, (j1-j0+3)/4
	dst = dst[:quads*count*4]
	for q := range quads {
		for b := range count {
			d := dst[(q*count+b)*4 : (q*count+b)*4+4]
			for c := range d {
				if j := j0 + 4*q + c; j < j1 {
					d[c] = u[(i1+b)*k+j]
				} else {
					d[c] = 0
				}
			}
		}
	}
	return dst
}

// updateRowPair does w0[j] −= Σ_b e0[b]·U[b, j] for the columns j of one packed tile, and the
// same for w1 unless it is nil: two rows and four columns at a time, eight sums in registers,
// so that each loaded value is used twice or four times.
func updateRowPair(w0, w1, e0, e1, packed []float32) {
	count := len(e0)
	e1 = e1[:count]
	for q := 0; 4*q < len(w0); q++ {
		p := packed[q*count*4 : (q+1)*count*4]
		var a0, a1, a2, a3, b0, b1, b2, b3 float32
		for b, x := range e0 {
			y := e1[b]
			ub := p[4*b : 4*b+4 : 4*b+4]
			u0, u1, u2, u3 := ub[0], ub[1], ub[2], ub[3]
			a0 += x * u0
			a1 += x * u1
			a2 += x * u2
			a3 += x * u3
			b0 += y * u0
			b1 += y * u1
			b2 += y * u2
			b3 += y * u3
		}
		subtract4(w0[4*q:], a0, a1, a2, a3)
		if w1 != nil {
			subtract4(w1[4*q:], b0, b1, b2, b3)
		}
	}
}

// subtract4 subtracts up to four sums from w (fewer at the end of a row).
func subtract4(w []float32, s0, s1, s2, s3 float32) {
	if len(w) >= 4 {
		w[0] -= s0
		w[1] -= s1
		w[2] -= s2
		w[3] -= s3
		return
	}
	sums := [3]float32{s0, s1, s2}
	for i := range w {
		w[i] -= sums[i]
	}
}
