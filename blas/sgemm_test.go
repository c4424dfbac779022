package blas

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func randomMatrix(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// poisoned returns n NaNs: every output must be written, padding never.
func poisoned(n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(math.NaN())
	}
	return s
}

// at is op(X)[i, j] of a row-major X with row stride ld.
func at(x []float32, ld int, t Transpose, i, j int) float64 {
	if t == Trans {
		i, j = j, i
	}
	return float64(x[i*ld+j])
}

// referenceGemm is alpha·op(A)·op(B) + beta·C summed in float64: the plain Go reference.
func referenceGemm(tA, tB Transpose, m, n, k int, alpha float64, a []float32, lda int, b []float32, ldb int, beta float64, c []float32, ldc int) []float64 {
	out := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				s += at(a, lda, tA, i, p) * at(b, ldb, tB, p, j)
			}
			out[i*n+j] = alpha * s
			if beta != 0 {
				out[i*n+j] += beta * float64(c[i*ldc+j])
			}
		}
	}
	return out
}

// kernels lists every kernel this CPU runs: the SIMD ones and the portable one.
func kernels() []*kernel { return append(simdKernels(), portable) }

// gemmCase is one product's shape: sizes, padding of every row stride, and the scalars.
type gemmCase struct {
	tA, tB      Transpose
	m, n, k     int
	pad         int
	alpha, beta float32
}

func (g gemmCase) String() string {
	return fmt.Sprintf("%v%v %d×%d×%d pad %d α %g β %g", trans2(g.tA), trans2(g.tB), g.m, g.n, g.k, g.pad, g.alpha, g.beta)
}

func trans2(t Transpose) string {
	if t == Trans {
		return "T"
	}
	return "N"
}

// gemmCases are awkward sizes: ones, k = 1, tiles of every kernel ± 1, blocks (kc, mc) ± 1, in
// all four transpositions, with strides larger than the rows.
func gemmCases() []gemmCase {
	sizes := [][3]int{
		{1, 1, 1}, {1, 7, 3}, {5, 1, 13}, {3, 4, 1}, {14, 32, 1}, {15, 33, 2}, {13, 31, 257},
		{6, 16, 256}, {7, 17, 255}, {29, 65, 64}, {127, 257, 33}, {253, 70, 513}, {300, 11, 777}, {2, 1000, 129},
	}
	var cs []gemmCase
	for i, s := range sizes {
		for _, tA := range []Transpose{NoTrans, Trans} {
			for _, tB := range []Transpose{NoTrans, Trans} {
				c := gemmCase{tA: tA, tB: tB, m: s[0], n: s[1], k: s[2], pad: i % 4, alpha: 1}
				switch i % 3 {
				case 1:
					c.alpha, c.beta = -0.5, 1
				case 2:
					c.alpha, c.beta = 2, -0.75
				}
				cs = append(cs, c)
			}
		}
	}
	return cs
}

// runCase computes the case with f on fresh random data and checks it against referenceGemm:
// the relative error, every output written, padding untouched. It returns C.
func runCase(t *testing.T, name string, g gemmCase, seed uint64, f func(a []float32, lda int, b []float32, ldb int, c []float32, ldc int)) []float32 {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	aRows, aCols := g.m, g.k
	if g.tA == Trans {
		aRows, aCols = aCols, aRows
	}
	bRows, bCols := g.k, g.n
	if g.tB == Trans {
		bRows, bCols = bCols, bRows
	}
	lda, ldb, ldc := aCols+g.pad, bCols+2*g.pad, g.n+g.pad
	a, b := randomMatrix(r, (aRows-1)*lda+aCols), randomMatrix(r, (bRows-1)*ldb+bCols)
	c := poisoned((g.m-1)*ldc + g.n)
	if g.beta != 0 {
		for i := range g.m {
			copy(c[i*ldc:i*ldc+g.n], randomMatrix(r, g.n))
		}
	}
	want := referenceGemm(g.tA, g.tB, g.m, g.n, g.k, float64(g.alpha), a, lda, b, ldb, float64(g.beta), c, ldc)
	f(a, lda, b, ldb, c, ldc)
	var diff2, ref2 float64
	for i := range g.m {
		for j := range g.n {
			got := float64(c[i*ldc+j])
			if math.IsNaN(got) {
				t.Fatalf("%s %v: C[%d,%d] not written", name, g, i, j)
			}
			d := got - want[i*g.n+j]
			diff2 += d * d
			ref2 += want[i*g.n+j] * want[i*g.n+j]
		}
		for j := g.n; j < ldc && i < g.m-1; j++ {
			if !math.IsNaN(float64(c[i*ldc+j])) {
				t.Fatalf("%s %v: padding C[%d,%d] overwritten", name, g, i, j)
			}
		}
	}
	if rel := math.Sqrt(diff2 / ref2); !(rel < 1e-5) {
		t.Errorf("%s %v: ‖C−ref‖/‖ref‖ = %.2e, want < 1e-5", name, g, rel)
	}
	return c
}

// TestGoEngineMatchesFloat64 runs every kernel, on one goroutine and on three, against the
// float64 reference; the kernels (all of them sum each output in step order with FMA, except
// the portable one) and the worker counts must agree bit for bit.
func TestGoEngineMatchesFloat64(t *testing.T) {
	for ci, g := range gemmCases() {
		var first []float32
		for _, kern := range kernels() {
			for _, workers := range []int{1, 3} {
				name := fmt.Sprintf("%s, %d workers", kern.name, workers)
				c := runCase(t, name, g, uint64(ci), func(a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
					o := &operands{tA: g.tA, tB: g.tB, m: g.m, n: g.n, k: g.k, alpha: g.alpha, a: a, lda: lda, b: b, ldb: ldb}
					gemmGo(kern, workers, o, g.beta, c, ldc)
				})
				if !kern.simd {
					continue
				}
				if first == nil {
					first = c
				} else if !slices.Equal(first, c) && !slices.ContainsFunc(c, func(v float32) bool { return v != v }) {
					t.Errorf("%s %v: result differs from the first SIMD kernel's", name, g)
				}
			}
		}
	}
}

// TestSgemmMatchesFloat64 checks the public entry points on the path this process chose.
func TestSgemmMatchesFloat64(t *testing.T) {
	t.Logf("path: %+v", Current())
	for ci, g := range gemmCases() {
		runCase(t, "Sgemm", g, uint64(ci), func(a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
			Sgemm(g.tA, g.tB, g.m, g.n, g.k, g.alpha, a, lda, b, ldb, g.beta, c, ldc)
		})
		runCase(t, "SgemmSerial", g, uint64(ci), func(a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
			SgemmSerial(g.tA, g.tB, g.m, g.n, g.k, g.alpha, a, lda, b, ldb, g.beta, c, ldc)
		})
	}
}

// TestOpenBLASMatchesFloat64 checks the OpenBLAS binding when the library loads.
func TestOpenBLASMatchesFloat64(t *testing.T) {
	lib, err := openBLAS()
	if err != nil {
		t.Skip(err)
	}
	t.Logf("OpenBLAS loaded as %s", lib.path)
	for ci, g := range gemmCases() {
		runCase(t, "OpenBLAS", g, uint64(ci), func(a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
			lib.gemm(g.tA, g.tB, g.m, g.n, g.k, g.alpha, a, lda, b, ldb, g.beta, c, ldc)
		})
	}
}

// TestKernelsAgainstReference runs each kernel alone on random panels, kc = 1 included, in both
// modes (write and add), against plain float64 sums.
func TestKernelsAgainstReference(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, kern := range kernels() {
		for _, kc := range []int{1, 2, 3, 17, 256} {
			a, b := randomMatrix(r, kc*kern.mr), randomMatrix(r, kc*kern.nr)
			ldc := kern.nr + 3
			c0 := randomMatrix(r, kern.mr*ldc)
			for _, add := range []bool{false, true} {
				c := slices.Clone(c0)
				kern.run(kc, a, b, c, ldc, add)
				for i := range kern.mr {
					for j := range ldc {
						want := float64(c0[i*ldc+j])
						if j < kern.nr {
							var s float64
							for p := range kc {
								s += float64(a[p*kern.mr+i]) * float64(b[p*kern.nr+j])
							}
							if add {
								s += want
							}
							want = s
						}
						if d := math.Abs(float64(c[i*ldc+j]) - want); d > 1e-5*math.Sqrt(float64(kc))*(1+math.Abs(want)) {
							t.Fatalf("%s kc %d add %v: c[%d,%d] = %g, want %g", kern.name, kc, add, i, j, c[i*ldc+j], want)
						}
					}
				}
			}
		}
	}
}

func TestSgemmEmpty(t *testing.T) {
	c := []float32{1, 2, 3, 4, 5, float32(math.NaN())}
	Sgemm(NoTrans, NoTrans, 2, 3, 0, 1, nil, 1, nil, 3, 0, c, 3)
	for i, v := range c {
		if v != 0 {
			t.Errorf("c[%d] = %g after a k=0 product with β = 0, want 0", i, v)
		}
	}
	c = []float32{1, 2, 3, 4, 5, 6}
	Sgemm(NoTrans, NoTrans, 2, 3, 4, 0, make([]float32, 8), 4, make([]float32, 12), 3, 2, c, 3)
	for i, v := range c {
		if v != float32(2*(i+1)) {
			t.Errorf("c[%d] = %g after an α = 0 product with β = 2, want %d", i, v, 2*(i+1))
		}
	}
	Sgemm(NoTrans, NoTrans, 0, 3, 4, 1, nil, 4, make([]float32, 12), 3, 0, nil, 3) // nothing to do, no panic
}

func TestSgemmRejectsShortSlices(t *testing.T) {
	f := func(n int) []float32 { return make([]float32, n) }
	cases := map[string]func(){
		"short A":   func() { SgemmNT(4, 4, 4, f(15), 4, f(16), 4, f(16), 4) },
		"short B":   func() { SgemmNT(4, 4, 4, f(16), 4, f(15), 4, f(16), 4) },
		"short C":   func() { SgemmNT(4, 4, 4, f(16), 4, f(16), 4, f(15), 4) },
		"small ld":  func() { SgemmNT(4, 4, 4, f(16), 3, f(16), 4, f(16), 4) },
		"negative":  func() { SgemmNT(-1, 4, 4, nil, 4, f(16), 4, nil, 4) },
		"short AT":  func() { Sgemm(Trans, NoTrans, 4, 4, 3, 1, f(11), 4, f(12), 4, 0, f(16), 4) },
		"syrk X":    func() { SyrkT64(4, 4, 1, f(15), 4, 0, make([]float64, 16), 4) },
		"syrk C":    func() { SyrkT64(4, 4, 1, f(16), 4, 0, make([]float64, 15), 4) },
		"kernel":    func() { kernels()[0].run(4, f(1), f(1), f(1), 1, false) },
		"syrk ld":   func() { SyrkT64(4, 4, 1, f(16), 3, 0, make([]float64, 16), 4) },
		"serial ld": func() { SgemmSerial(NoTrans, NoTrans, 2, 2, 2, 1, f(4), 2, f(4), 2, 0, f(4), 1) },
	}
	for name, call := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			call()
		})
	}
}

// TestSyrkT64 checks the upper triangle against float64 sums for every kernel, β = 0 on a
// poisoned C, β = 1 and a general β; the lower triangle must stay as it was.
func TestSyrkT64(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, kern := range kernels() {
		for _, s := range [][2]int{{1, 1}, {5, 1}, {15, 3}, {33, 300}, {70, 513}, {129, 64}} {
			n, k := s[0], s[1]
			for _, beta := range []float64{0, 1, 0.25} {
				ldx, ldc := n+1, n+2
				x := randomMatrix(r, (k-1)*ldx+n)
				c := make([]float64, (n-1)*ldc+n)
				for i := range c {
					c[i] = r.NormFloat64()
				}
				if beta == 0 {
					for i := range n {
						for j := i; j < n; j++ {
							c[i*ldc+j] = math.NaN()
						}
					}
				}
				old := slices.Clone(c)
				out := &upperFloat64Out{c: c, n: n, ldc: ldc, alpha: 0.5, beta: beta}
				syrkGo(kern, 3, n, k, x, ldx, out)
				for i := range n {
					for j := range n {
						want := old[i*ldc+j]
						if j >= i {
							var sum float64
							for p := range k {
								sum += float64(x[p*ldx+i]) * float64(x[p*ldx+j])
							}
							want = 0.5 * sum
							if beta != 0 {
								want += beta * old[i*ldc+j]
							}
						}
						got := c[i*ldc+j]
						if !(math.Abs(got-want) <= 1e-5*math.Sqrt(float64(k))*(1+math.Abs(want))) && !(j < i && got == want) {
							t.Fatalf("%s n %d k %d β %g: C[%d,%d] = %g, want %g", kern.name, n, k, beta, i, j, got, want)
						}
					}
				}
			}
		}
	}
	c := []float64{1, 2, 3, 4}
	SyrkT64(2, 0, 1, nil, 2, 0.5, c, 2)
	if !slices.Equal(c, []float64{0.5, 1, 3, 2}) {
		t.Errorf("k = 0, β = 0.5: C = %v, want [0.5 1 3 2]", c)
	}
}

func TestChoose(t *testing.T) {
	simd := &kernel{name: "fake", mr: 1, nr: 1, simd: true}
	found := func() (*library, error) { return &library{path: "libopenblas.so.0"}, nil }
	missing := func() (*library, error) { return nil, fmt.Errorf("OpenBLAS not found") }
	cases := []struct {
		setting  string
		simd     []*kernel
		load     func() (*library, error)
		kernel   string
		openBLAS bool
		slow     bool
	}{
		{"", []*kernel{simd}, found, "fake", false, false},
		{"", nil, found, portable.name, true, false},
		{"", nil, missing, portable.name, false, true},
		{"go", nil, found, portable.name, false, true},
		{"openblas", []*kernel{simd}, found, "fake", true, false},
		{"openblas", []*kernel{simd}, missing, "fake", false, false},
		{"portable", []*kernel{simd}, found, portable.name, false, true},
		{"bogus", []*kernel{simd}, found, "fake", false, false},
	}
	for _, c := range cases {
		p := choose(c.setting, c.simd, c.load)
		if p.kernel.name != c.kernel || p.UseOpenBLAS != c.openBLAS || (p.SlowNote() != "") != c.slow || p.Reason == "" {
			t.Errorf("QPACK_BLAS=%q, %d SIMD kernels: %+v, note %q", c.setting, len(c.simd), p, p.SlowNote())
		}
	}
}

// TestTransposeInto checks the packing transposition (transpose8 blocks, overlapping last
// blocks, tails of lanes and steps, zero lanes, α) against a plain loop.
func TestTransposeInto(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, width := range []int{4, 8, 14, 16, 32} {
		for _, lanes := range []int{1, 3, 4, 7, 8, 9, 13, 14, 16, 31, 32} {
			if lanes > width {
				continue
			}
			for _, kc := range []int{1, 7, 8, 9, 17, 64} {
				for _, alpha := range []float32{1, -0.5} {
					ld := kc + 3
					src := randomMatrix(r, (lanes-1)*ld+kc)
					dst := poisoned(width * kc)
					transposeInto(dst, width, src, ld, lanes, kc, alpha)
					for p := range kc {
						for l := range width {
							want := float32(0)
							if l < lanes {
								want = alpha * src[l*ld+p]
							}
							if got := dst[p*width+l]; got != want {
								t.Fatalf("width %d lanes %d kc %d α %g: dst[%d,%d] = %g, want %g", width, lanes, kc, alpha, p, l, got, want)
							}
						}
					}
				}
			}
		}
	}
}
