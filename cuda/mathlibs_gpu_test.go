package cuda

import (
	"math"
	"math/rand/v2"
	"testing"
)

// deviceMatrix uploads data and returns its device copy (freed at cleanup).
func deviceMatrix[T float32 | float64](tb testing.TB, d *Device, data []T) DevicePtr {
	tb.Helper()
	p, err := d.Alloc(len(Bytes(data)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Free(p) })
	if err := d.CopyToDevice(p, Bytes(data)); err != nil {
		tb.Fatal(err)
	}
	return p
}

func download[T float32 | float64 | int32](tb testing.TB, d *Device, p DevicePtr, n int) []T {
	tb.Helper()
	out := make([]T, n)
	if err := d.CopyFromDevice(Bytes(out), p); err != nil {
		tb.Fatal(err)
	}
	return out
}

// TestGemmMatchesPlainGo: C = alpha·op(A)·op(B) + beta·C, column-major, with transposes and
// leading dimensions larger than the rows, in float32 and float64, against float64 loops.
func TestGemmMatchesPlainGo(t *testing.T) {
	d := openTestDevice(t)
	b, err := d.NewBLAS()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r := rand.New(rand.NewPCG(3, 4))
	const m, n, k, ld = 37, 29, 71, 80
	for _, ta := range []Transpose{NoTrans, Trans} {
		for _, tb := range []Transpose{NoTrans, Trans} {
			a, bm, c := make([]float64, ld*ld), make([]float64, ld*ld), make([]float64, ld*ld)
			for i := range a {
				a[i], bm[i], c[i] = r.NormFloat64(), r.NormFloat64(), r.NormFloat64()
			}
			at := func(i, l int) float64 { // op(A)[i, l]
				if ta == Trans {
					return a[l+i*ld]
				}
				return a[i+l*ld]
			}
			bt := func(l, j int) float64 {
				if tb == Trans {
					return bm[j+l*ld]
				}
				return bm[l+j*ld]
			}
			want := append([]float64(nil), c...)
			for i := range m {
				for j := range n {
					s := 0.0
					for l := range k {
						s += at(i, l) * bt(l, j)
					}
					want[i+j*ld] = -0.5*s + 2*c[i+j*ld]
				}
			}
			f32 := func(v []float64) []float32 {
				out := make([]float32, len(v))
				for i, x := range v {
					out[i] = float32(x)
				}
				return out
			}
			dc64 := deviceMatrix(t, d, c)
			if err := b.Dgemm(ta, tb, m, n, k, -0.5, deviceMatrix(t, d, a), ld, deviceMatrix(t, d, bm), ld, 2, dc64, ld); err != nil {
				t.Fatal(err)
			}
			dc32 := deviceMatrix(t, d, f32(c))
			if err := b.Sgemm(ta, tb, m, n, k, -0.5, deviceMatrix(t, d, f32(a)), ld, deviceMatrix(t, d, f32(bm)), ld, 2, dc32, ld); err != nil {
				t.Fatal(err)
			}
			got64, got32 := download[float64](t, d, dc64, len(c)), download[float32](t, d, dc32, len(c))
			for i := range want {
				if math.Abs(got64[i]-want[i]) > 1e-12*(1+math.Abs(want[i]))*k {
					t.Fatalf("trans %d/%d: Dgemm[%d] = %g, want %g", ta, tb, i, got64[i], want[i])
				}
				if math.Abs(float64(got32[i])-want[i]) > 1e-5*k {
					t.Fatalf("trans %d/%d: Sgemm[%d] = %g, want %g", ta, tb, i, got32[i], want[i])
				}
			}
		}
	}
}

// TestCholesky: Potrf gives L with L·Lᵀ = A, in float64 and float32; a matrix that is not
// positive definite reports info > 0.
func TestCholesky(t *testing.T) {
	d := openTestDevice(t)
	s, err := d.NewSolver()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	info, err := d.Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(info)
	r := rand.New(rand.NewPCG(5, 6))
	const n = 150
	x := make([]float64, n*2*n)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	a := make([]float64, n*n) // A = X·Xᵀ/2n + 0.1·I, column-major (symmetric)
	for i := range n {
		for j := range n {
			sum := 0.0
			for l := range 2 * n {
				sum += x[i*2*n+l] * x[j*2*n+l]
			}
			a[i+j*n] = sum / (2 * n)
			if i == j {
				a[i+j*n] += 0.1
			}
		}
	}
	for _, dt := range []DataType{Float64, Float32} {
		tol := 1e-10
		var p DevicePtr
		if dt == Float64 {
			p = deviceMatrix(t, d, a)
		} else {
			tol = 2e-4
			a32 := make([]float32, len(a))
			for i, v := range a {
				a32[i] = float32(v)
			}
			p = deviceMatrix(t, d, a32)
		}
		if err := d.Fill32(info, 7, 2); err != nil {
			t.Fatal(err)
		}
		if err := s.Potrf(Lower, n, dt, p, n, info); err != nil {
			t.Fatal(err)
		}
		l := lowerOf(t, d, p, n, dt)
		if got := download[int32](t, d, info, 1); got[0] != 0 {
			t.Fatalf("dtype %d: info %v", dt, got)
		}
		for i := range n {
			for j := range n {
				llt := 0.0
				for q := range n {
					llt += l[i+q*n] * l[j+q*n]
				}
				if math.Abs(llt-a[i+j*n]) > tol {
					t.Fatalf("dtype %d (%d,%d): L·Lᵀ = %g (A = %g)", dt, i, j, llt, a[i+j*n])
				}
			}
		}
	}
	bad := append([]float64(nil), a...)
	bad[3+3*n] = -1
	p := deviceMatrix(t, d, bad)
	if err := s.Potrf(Lower, n, Float64, p, n, info); err != nil {
		t.Fatal(err)
	}
	if got := download[int32](t, d, info, 1); got[0] <= 0 {
		t.Errorf("indefinite matrix: info %d, want > 0", got[0])
	}
}

// lowerOf downloads the lower triangle of the column-major n×n matrix at p as float64 (zero above).
func lowerOf(tb testing.TB, d *Device, p DevicePtr, n int, dt DataType) []float64 {
	out := make([]float64, n*n)
	if dt == Float64 {
		copy(out, download[float64](tb, d, p, n*n))
	} else {
		for i, v := range download[float32](tb, d, p, n*n) {
			out[i] = float64(v)
		}
	}
	for j := range n {
		for i := 0; i < j; i++ {
			out[i+j*n] = 0
		}
	}
	return out
}

// TestStridedBatchedGemmAndTF32: each product of a strided batch equals its float64 loop, to
// float32 rounding with the default math and to TF32 rounding after SetTF32(true).
func TestStridedBatchedGemmAndTF32(t *testing.T) {
	d := openTestDevice(t)
	b, err := d.NewBLAS()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r := rand.New(rand.NewPCG(5, 6))
	const m, n, k, batch = 45, 33, 130, 3
	a, bm := make([]float32, batch*m*k), make([]float32, batch*k*n)
	for i := range a {
		a[i] = float32(r.NormFloat64())
	}
	for i := range bm {
		bm[i] = float32(r.NormFloat64())
	}
	want := make([]float64, batch*m*n) // column-major C_i = A_i·B_i
	for i := range batch {
		for col := range n {
			for row := range m {
				var s float64
				for l := range k {
					s += float64(a[i*m*k+row+l*m]) * float64(bm[i*k*n+l+col*k])
				}
				want[i*m*n+row+col*m] = s
			}
		}
	}
	pa, pb := deviceMatrix(t, d, a), deviceMatrix(t, d, bm)
	pc := deviceMatrix(t, d, make([]float32, batch*m*n))
	for _, tc := range []struct {
		tf32   bool
		maxRel float64
	}{{false, 1e-5}, {true, 3e-3}} {
		if err := b.SetTF32(tc.tf32); err != nil {
			t.Fatal(err)
		}
		if err := d.Fill32(pc, 0x7fc00000, batch*m*n); err != nil { // NaN: every element must be written
			t.Fatal(err)
		}
		if err := b.SgemmStridedBatched(NoTrans, NoTrans, m, n, k, 1, pa, m, m*k, pb, k, k*n, 0, pc, m, m*n, batch); err != nil {
			t.Fatal(err)
		}
		got := download[float32](t, d, pc, batch*m*n)
		var num, den float64
		for i, w := range want {
			e := float64(got[i]) - w
			if math.IsNaN(e) {
				t.Fatalf("tf32=%v: element %d not written", tc.tf32, i)
			}
			num += e * e
			den += w * w
		}
		if rel := math.Sqrt(num / den); rel > tc.maxRel {
			t.Errorf("tf32=%v: relative error %.2e > %.0e", tc.tf32, rel, tc.maxRel)
		}
	}
}
