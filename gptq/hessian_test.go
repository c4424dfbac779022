package gptq

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestHessianAdd: batches of different sizes give 2/n Σ xᵀx (computed naively in float64),
// Merge of two partial Hessians gives the same, and bad batches are refused. Add's products
// and its sums over at most 512 tokens are float32 (blas.SyrkT64), so each entry may be off by
// 513 float32 roundings of Σ|x_i·x_j|, the float64 sums adding nothing that matters.
func TestHessianAdd(t *testing.T) {
	for _, k := range []int{1, 7, 64, 133} {
		r := rand.New(rand.NewPCG(uint64(k), 1))
		tokens := 3*k + 5
		x := correlatedActivations(r, tokens, k)
		want, bound := make([]float64, k*k), make([]float64, k*k)
		for tk := range tokens {
			for i := range k {
				for j := range k {
					p := float64(x[tk*k+i]) * float64(x[tk*k+j])
					want[i*k+j] += p
					bound[i*k+j] += math.Abs(p)
				}
			}
		}
		for i := range want {
			want[i] *= 2 / float64(tokens)
			bound[i] *= 2 / float64(tokens) * 513 * 0x1p-24
		}
		var whole, a, b Hessian
		split := tokens / 3
		for lo, step := 0, 1; lo < tokens; lo, step = lo+step, step*2 {
			hi := min(lo+step, tokens)
			if err := whole.Add(x[lo*k:hi*k], hi-lo, k); err != nil {
				t.Fatal(err)
			}
		}
		must(t, a.Add(x[:split*k], split, k))
		must(t, b.Add(x[split*k:], tokens-split, k))
		must(t, a.Merge(&b))
		for name, h := range map[string]*Hessian{"batched": &whole, "merged": &a} {
			if h.N != tokens {
				t.Errorf("k=%d %s: N = %d, want %d", k, name, h.N, tokens)
			}
			for i, v := range h.Matrix() {
				if math.Abs(v-want[i]) > bound[i] {
					t.Fatalf("k=%d %s: H[%d,%d] = %g, want %g", k, name, i/k, i%k, v, want[i])
				}
			}
		}
	}
	h := NewHessian(4)
	x := []float32{1, 2, 3, float32(math.NaN())}
	if err := h.Add(x, 1, 4); err == nil || !strings.Contains(err.Error(), "column 3") {
		t.Errorf("NaN activation: got %v", err)
	}
	if err := h.Add(x[:3], 1, 3); err == nil || !strings.Contains(err.Error(), "width 4") {
		t.Errorf("width mismatch: got %v", err)
	}
	if err := h.Add(x, 2, 4); err == nil {
		t.Error("short batch accepted")
	}
	if h.N != 0 {
		t.Errorf("refused batches changed N to %d", h.N)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestHessianReadBetweenAdds: Add updates the upper triangle and Matrix mirrors it when H is
// read, so reading H between batches, or merging a read Hessian with an unread one, gives
// exactly the matrix of adding every batch and reading once.
func TestHessianReadBetweenAdds(t *testing.T) {
	const k, rows = 40, 7
	x := correlatedActivations(rand.New(rand.NewPCG(5, 5)), 3*rows, k)
	batch := func(i int) []float32 { return x[i*rows*k : (i+1)*rows*k] }
	var once, read, merged, other Hessian
	for i := range 3 {
		must(t, once.Add(batch(i), rows, k))
	}
	for i := range 3 {
		must(t, read.Add(batch(i), rows, k))
		read.Matrix()
	}
	must(t, merged.Add(batch(0), rows, k))
	merged.Matrix()
	must(t, other.Add(batch(1), rows, k))
	must(t, other.Add(batch(2), rows, k))
	must(t, merged.Merge(&other))
	want := once.Matrix()
	for i := range k {
		for j := range i {
			if want[i*k+j] != want[j*k+i] {
				t.Fatalf("H[%d,%d] = %g, H[%d,%d] = %g: not symmetric", i, j, want[i*k+j], j, i, want[j*k+i])
			}
		}
	}
	for name, h := range map[string]*Hessian{"read between batches": &read, "merged": &merged} {
		got := h.Matrix()
		for i := range want {
			if d := math.Abs(got[i] - want[i]); d > 1e-12*math.Abs(want[i]) {
				t.Fatalf("%s: H[%d,%d] = %g, want %g", name, i/k, i%k, got[i], want[i])
			}
		}
	}
}
