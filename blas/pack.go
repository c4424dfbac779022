package blas

// operands is one product op(A)·op(B): op(A) is m×k, op(B) is k×n, both row-major in memory
// with row strides lda and ldb before the transposition. alpha scales A as it is packed.
type operands struct {
	tA, tB  Transpose
	m, n, k int
	alpha   float32
	a       []float32
	lda     int
	b       []float32
	ldb     int
}

// packA copies rows [i0, i0+rows) × steps [p0, p0+kc) of alpha·op(A) into dst as panels of mr
// rows: panel q holds, step after step, the mr values of rows i0+q·mr … (zero past the last
// row). It returns the packed length.
func (o *operands) packA(dst []float32, i0, rows, p0, kc, mr int) int {
	panels := (rows + mr - 1) / mr
	for q := range panels {
		panel := dst[q*mr*kc : (q+1)*mr*kc]
		first, count := i0+q*mr, min(mr, rows-q*mr)
		if o.tA {
			// A is stored k×m: the mr values of one step are adjacent.
			for p := range kc {
				d := panel[p*mr : (p+1)*mr]
				src := o.a[(p0+p)*o.lda+first:][:count]
				scaleCopy(d, src, o.alpha)
				clear(d[count:])
			}
			continue
		}
		// A is stored m×k: each row is adjacent along the steps; scatter it into its lane.
		transposeInto(panel, mr, o.a[first*o.lda+p0:], o.lda, count, kc, o.alpha)
	}
	return panels * mr * kc
}

// packB copies steps [p0, p0+kc) × columns [j0, j0+cols) of op(B) into dst as panels of nr
// columns: panel q holds, step after step, the nr values of columns j0+q·nr … (zero past the
// last column).
func (o *operands) packB(dst []float32, j0, cols, p0, kc, nr int) {
	panels := (cols + nr - 1) / nr
	for q := range panels {
		panel := dst[q*nr*kc : (q+1)*nr*kc]
		first, count := j0+q*nr, min(nr, cols-q*nr)
		if !o.tB {
			// B is stored k×n: the nr values of one step are adjacent.
			for p := range kc {
				d := panel[p*nr : (p+1)*nr]
				copy(d, o.b[(p0+p)*o.ldb+first:][:count])
				clear(d[count:])
			}
			continue
		}
		// B is stored n×k (the weights of a linear layer): each column is adjacent along the steps.
		transposeInto(panel, nr, o.b[first*o.ldb+p0:], o.ldb, count, kc, 1)
	}
}

// transposeInto writes lanes × kc values to the panel dst (kc steps of width values): lane r
// of step p is alpha·src[r·ld + p] for r < lanes, zero for lanes ≤ r < width. Blocks of 8×8
// go through transpose8 where the CPU has it (a last block of lanes may overlap the one before:
// both write the same values), the rest four lanes at a time so that each step's stores are
// adjacent.
func transposeInto(dst []float32, width int, src []float32, ld, lanes, kc int, alpha float32) {
	dst = dst[:width*kc]
	r := 0
	if hasAVX2 && lanes >= 8 && kc >= 8 {
		_ = src[(lanes-1)*ld+kc-1] // every read below is inside src
		for r0 := 0; r0 < lanes; r0 += 8 {
			r0 = min(r0, lanes-8)
			p := 0
			for ; p+8 <= kc; p += 8 {
				transpose8(&dst[p*width+r0], width, &src[r0*ld+p], ld, alpha)
			}
			for ; p < kc; p++ {
				d := dst[p*width+r0:][:8]
				for i := range d {
					d[i] = alpha * src[(r0+i)*ld+p]
				}
			}
		}
		r = lanes
	}
	for ; r+4 <= lanes; r += 4 {
		s0 := src[r*ld:][:kc]
		s1 := src[(r+1)*ld:][:kc]
		s2 := src[(r+2)*ld:][:kc]
		s3 := src[(r+3)*ld:][:kc]
		for p, v := range s0 {
			d := dst[p*width+r:][:4]
			d[0], d[1], d[2], d[3] = alpha*v, alpha*s1[p], alpha*s2[p], alpha*s3[p]
		}
	}
	for ; r < lanes; r++ {
		for p, v := range src[r*ld:][:kc] {
			dst[p*width+r] = alpha * v
		}
	}
	for ; r < width; r++ {
		for p := range kc {
			dst[p*width+r] = 0
		}
	}
}

// scaleCopy writes alpha·src to dst.
func scaleCopy(dst, src []float32, alpha float32) {
	if alpha == 1 {
		copy(dst, src)
		return
	}
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = alpha * v
	}
}
