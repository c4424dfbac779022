package blas

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// requireBLAS skips when OpenBLAS is not loaded, saying why.
func requireBLAS(tb testing.TB) {
	tb.Helper()
	if err := LoadErr(); err != nil {
		tb.Skip(err)
	}
}

func randomMatrix(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// referenceNT is A·Bᵀ summed in float64.
func referenceNT(m, n, k int, a []float32, lda int, b []float32, ldb int) []float64 {
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				s += float64(a[i*lda+p]) * float64(b[j*ldb+p])
			}
			c[i*n+j] = s
		}
	}
	return c
}

func TestSgemmNTMatchesFloat64(t *testing.T) {
	requireBLAS(t)
	path, _ := Available()
	t.Logf("OpenBLAS loaded as %s", path)
	r := rand.New(rand.NewPCG(1, 2))
	sizes := []struct{ m, n, k, pad int }{
		{1, 1, 1, 0}, {1, 7, 3, 0}, {5, 1, 13, 2}, {17, 31, 65, 3}, {64, 64, 64, 0},
		{127, 257, 33, 1}, {3, 1000, 129, 5}, {300, 11, 777, 0}, {129, 130, 131, 7},
	}
	for _, s := range sizes {
		// Padding makes every leading dimension larger than its row, so strides are exercised.
		lda, ldb, ldc := s.k+s.pad, s.k+2*s.pad, s.n+s.pad
		a, b := randomMatrix(r, (s.m-1)*lda+s.k), randomMatrix(r, (s.n-1)*ldb+s.k)
		c := make([]float32, (s.m-1)*ldc+s.n)
		for i := range c {
			c[i] = float32(math.NaN()) // poisoned: every output must be written, padding never
		}
		if !SgemmNT(s.m, s.n, s.k, a, lda, b, ldb, c, ldc) {
			t.Fatal("SgemmNT returned false although OpenBLAS is loaded")
		}
		want := referenceNT(s.m, s.n, s.k, a, lda, b, ldb)
		var diff2, ref2 float64
		for i := range s.m {
			for j := range s.n {
				got := float64(c[i*ldc+j])
				if math.IsNaN(got) {
					t.Fatalf("%d×%d×%d: C[%d,%d] not written", s.m, s.n, s.k, i, j)
				}
				d := got - want[i*s.n+j]
				diff2 += d * d
				ref2 += want[i*s.n+j] * want[i*s.n+j]
			}
			for j := s.n; j < ldc && i < s.m-1; j++ {
				if !math.IsNaN(float64(c[i*ldc+j])) {
					t.Fatalf("%d×%d×%d: padding C[%d,%d] overwritten", s.m, s.n, s.k, i, j)
				}
			}
		}
		rel := math.Sqrt(diff2 / ref2)
		if !(rel < 1e-5) {
			t.Errorf("%d×%d×%d (pad %d): ‖C−ref‖/‖ref‖ = %.2e, want < 1e-5", s.m, s.n, s.k, s.pad, rel)
		}
	}
}

func TestSgemmNTEmptySum(t *testing.T) {
	requireBLAS(t)
	c := []float32{1, 2, 3, 4, 5, 6}
	if !SgemmNT(2, 3, 0, nil, 1, nil, 1, c, 3) {
		t.Fatal("SgemmNT returned false although OpenBLAS is loaded")
	}
	for i, v := range c {
		if v != 0 {
			t.Errorf("c[%d] = %g after a k=0 product, want 0", i, v)
		}
	}
}

func TestSgemmNTRejectsShortSlices(t *testing.T) {
	cases := map[string]func(){
		"short A": func() { SgemmNT(4, 4, 4, make([]float32, 15), 4, make([]float32, 16), 4, make([]float32, 16), 4) },
		"short B": func() { SgemmNT(4, 4, 4, make([]float32, 16), 4, make([]float32, 15), 4, make([]float32, 16), 4) },
		"short C": func() { SgemmNT(4, 4, 4, make([]float32, 16), 4, make([]float32, 16), 4, make([]float32, 15), 4) },
		"small ld": func() {
			SgemmNT(4, 4, 4, make([]float32, 16), 3, make([]float32, 16), 4, make([]float32, 16), 4)
		},
		"negative": func() { SgemmNT(-1, 4, 4, nil, 4, make([]float32, 16), 4, nil, 4) },
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

func TestOpenSkipsLibrariesWithoutSgemm(t *testing.T) {
	// libc loads but has no cblas_sgemm; the second name does not exist.
	_, err := open([]string{"libc.so.6", "/nonexistent/libopenblas.so.0"})
	if err == nil {
		t.Fatal("open accepted a library without cblas_sgemm")
	}
	for _, want := range []string{"libc.so.6: no cblas_sgemm", "/nonexistent/libopenblas.so.0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
