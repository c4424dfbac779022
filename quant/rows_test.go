package quant

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// randomValidTensor returns a valid tensor of scheme s with random codes and parameters.
func randomValidTensor(r *rand.Rand, s Scheme, n, k int, actOrder bool) *Tensor {
	ng := s.Groups(k)
	t := &Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k), Scales: make([]float32, n*ng)}
	for i := range t.Codes {
		t.Codes[i] = uint8(r.IntN(s.MaxQ() + 1))
		for s.Grid == FP8E4M3 && t.Codes[i]&0x7f == 0x7f {
			t.Codes[i] = uint8(r.IntN(256))
		}
	}
	for i := range t.Scales {
		t.Scales[i] = RoundF16(float32(r.Float64() + 0.01))
	}
	if s.Grid == Integer {
		t.Zeros = make([]uint8, n*ng)
		for i := range t.Zeros {
			t.Zeros[i] = uint8(r.IntN(s.MaxQ() + 1))
			if s.Sym {
				t.Zeros[i] = uint8((s.MaxQ() + 1) / 2)
			}
		}
	}
	if s.Grid == Binary && !s.Sym {
		t.Offsets = make([]float32, n*ng)
		for i := range t.Offsets {
			t.Offsets[i] = RoundF16(float32(r.NormFloat64()))
		}
	}
	if actOrder {
		t.GIdx = make([]int32, k)
		for i := range t.GIdx {
			t.GIdx[i] = int32(r.IntN(ng))
		}
	}
	return t
}

// DequantizeRows (groups hoisted) must equal the per-weight definition, for any row range.
func TestDequantizeRowsMatchesPerWeight(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	schemes := []Scheme{{Bits: 4, GroupSize: 128}, {Bits: 3, GroupSize: 32, Sym: true}, {Bits: 8, GroupSize: PerChannel},
		{Bits: 4, GroupSize: 64, Sym: true, Grid: NF4}, {Bits: 8, Sym: true, Grid: FP8E4M3},
		{Bits: 1, GroupSize: 16, Grid: Binary}, {Bits: 1, GroupSize: 8, Sym: true, Grid: Binary}}
	for _, s := range schemes {
		for _, nk := range [][2]int{{7, 300}, {1, 1}, {3, 129}, {5, 64}} {
			for _, act := range []bool{false, true} {
				if act && (s.GroupSize == PerChannel || s.Grid == FP8E4M3) {
					continue
				}
				x := randomValidTensor(r, s, nk[0], nk[1], act)
				if err := x.Validate(); err != nil {
					t.Fatalf("%s: %v", s, err)
				}
				all := x.Dequantize(nil)
				groups := s.Groups(x.K)
				for i, v := range all {
					if want := x.dequantizeOne(x.Codes[i], i/x.K*groups+x.Group(i%x.K)); math.Float32bits(v) != math.Float32bits(want) {
						t.Fatalf("%s %v act %v: weight %d = %v, want %v", s, nk, act, i, v, want)
					}
				}
				r0, r1 := r.IntN(x.N), x.N
				part := make([]float32, (r1-r0)*x.K)
				x.DequantizeRows(part, r0, r1)
				for i, v := range part {
					if v != all[r0*x.K+i] {
						t.Fatalf("%s %v: DequantizeRows(%d, %d)[%d] = %v, want %v", s, nk, r0, r1, i, v, all[r0*x.K+i])
					}
				}
			}
		}
	}
}

func TestOrBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for n := range 40 {
		b := make([]byte, n)
		var want byte
		for i := range b {
			b[i] = byte(r.IntN(256)) & byte(r.IntN(256)) & byte(r.IntN(256))
			want |= b[i]
		}
		if got := orBytes(b); got != want {
			t.Fatalf("len %d: orBytes %#x, want %#x", n, got, want)
		}
	}
}

// The fast code check must still name the first bad code, wherever it is.
func TestValidateFindsBadCodeAnywhere(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, s := range []Scheme{{Bits: 4, GroupSize: 32}, {Bits: 2, GroupSize: 32, Sym: true}, {Bits: 8, Sym: true, Grid: FP8E4M3}} {
		x := randomValidTensor(r, s, 3, 37, false)
		for _, at := range []int{0, 7, 8, 64, 3*37 - 1} {
			saved := x.Codes[at]
			x.Codes[at] = uint8(s.MaxQ() + 1)
			if s.Grid == FP8E4M3 {
				x.Codes[at] = 0xff
			}
			err := x.Validate()
			want := "row " + itoa(at/37) + ", column " + itoa(at%37)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: bad code at %d: got %v, want %q", s, at, err, want)
			}
			x.Codes[at] = saved
		}
		if err := x.Validate(); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
