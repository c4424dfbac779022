package ggmltype_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/quant"
)

func randomWeights(r *rand.Rand, n int) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(0.02 * r.NormFloat64())
		if r.IntN(50) == 0 {
			w[i] *= 8
		}
	}
	return w
}

// Every rung's tensor, fitted by qpack and written as ggml blocks, decodes through ggml's
// dequantizers (package gguf) to exactly the weights qpack's tensor stands for.
func TestEncodeDecodesExactly(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n, k = 6, 512
	w := randomWeights(r, n*k)
	imp := make([]float32, k)
	for i := range imp {
		imp[i] = float32(r.ExpFloat64())
	}
	for _, rung := range ggmltype.Rungs() {
		for _, imatrix := range []bool{false, true} {
			if f, ok := rung.Scheme.IQuant(); ok && f.Imatrix && !imatrix {
				continue // ggml fits it only with importance
			}
			opt := blockwise.Options{Imatrix: imatrix}
			if imatrix {
				opt.Importance = imp
			}
			q, err := blockwise.Quantize(w, n, k, rung.Scheme, opt)
			if err != nil {
				t.Fatalf("%s: %v", rung.Scheme, err)
			}
			typ, b, err := ggmltype.Encode(q)
			if err != nil {
				t.Fatalf("%s: %v", rung.Scheme, err)
			}
			if typ != rung.Type || int64(len(b)) != ggmltype.Bytes(typ, n, k) {
				t.Fatalf("%s: %s, %d bytes; want %s, %d", rung.Scheme, typ, len(b), rung.Type, ggmltype.Bytes(rung.Type, n, k))
			}
			got, err := decode(typ, b, n, k)
			if err != nil {
				t.Fatal(err)
			}
			want := q.Dequantize(nil)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s (imatrix %v): weight %d decodes to %v, qpack's tensor holds %v", typ, imatrix, i, got[i], want[i])
				}
			}
		}
	}
}

func TestRungsAndLookups(t *testing.T) {
	prev := 0.0
	for _, r := range ggmltype.Rungs() {
		bpw := 8 * float64(r.Type.TypeSize()) / float64(r.Type.BlockSize())
		if bpw < prev {
			t.Errorf("%s (%.4f bpw) after a rung of %.4f", r.Type, bpw, prev)
		}
		prev = bpw
		if got, ok := ggmltype.TypeOf(r.Scheme); !ok || got != r.Type {
			t.Errorf("ggmltype.TypeOf(%s) = %s", r.Scheme, got)
		}
		if got, ok := ggmltype.SchemeOf(r.Type); !ok || got != r.Scheme {
			t.Errorf("ggmltype.SchemeOf(%s) = %s", r.Type, got)
		}
	}
	if err := ggmltype.Supports(quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}); err == nil || !strings.Contains(err.Error(), "Q4_K") {
		t.Errorf("int4-g128-sym: %v", err)
	}
	if err := ggmltype.Fits(gguf.Q4_K, 384); err == nil {
		t.Error("Q4_K took rows of 384")
	}
	if err := ggmltype.Fits(gguf.Q5_0, 384); err != nil {
		t.Error(err)
	}
}

func TestEncodeRefuses(t *testing.T) {
	w := randomWeights(rand.New(rand.NewPCG(3, 4)), 2*64)
	q, err := blockwise.Quantize(w, 2, 64, mustScheme("int4-g32-sym"), blockwise.Options{})
	if err != nil {
		t.Fatal(err)
	}
	act := *q
	act.GIdx = make([]int32, 64)
	act.GIdx[0] = 1
	half := *q
	half.Scales = append([]float32(nil), q.Scales...)
	half.Scales[0] = 1e-7 + 1.5e-7 // not an F16 value
	kq4, _ := blockwise.Quantize(w, 2, 64, mustScheme("q4_k"), blockwise.Options{})
	for name, c := range map[string]*quant.Tensor{"act-order": &act, "scale": &half, "partial super-block": kq4} {
		if _, _, err := ggmltype.Encode(c); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestFallback(t *testing.T) {
	for _, c := range []struct {
		typ  gguf.Type
		k    int
		want gguf.Type
		ok   bool
	}{
		{gguf.Q4_K, 512, gguf.Q4_K, true}, {gguf.Q4_K, 384, gguf.Q5_0, true}, {gguf.Q6_K, 1024 + 32, gguf.Q8_0, true},
		{gguf.Q3_K, 384, gguf.IQ4_NL, true}, {gguf.IQ2_XS, 4096 + 32, gguf.IQ4_NL, true}, {gguf.IQ4_NL, 32, gguf.IQ4_NL, true}, {gguf.Q5_K, 384, gguf.Q5_0, true}, {gguf.Q4_K, 100, 0, false}, {gguf.Q8_0, 100, 0, false},
	} {
		got, why, ok := ggmltype.Fallback(c.typ, c.k)
		if got != c.want || ok != c.ok || (got != c.typ && why == "") {
			t.Errorf("ggmltype.Fallback(%s, %d) = %s, %q, %v; want %s, %v", c.typ, c.k, got, why, ok, c.want, c.ok)
		}
	}
}

// decode is ggml's dequantization of b: package gguf's for the integer and k-quant types,
// package iquant's for the lattice types.
func decode(typ gguf.Type, b []byte, n, k int) ([]float32, error) {
	s, _ := ggmltype.SchemeOf(typ)
	if s.Grid != quant.IQuant {
		return gguf.Decode(nil, typ, b)
	}
	q, err := iquant.Decode(s, b, n, k)
	if err != nil {
		return nil, err
	}
	return q.Dequantize(nil), nil
}

func mustScheme(name string) quant.Scheme {
	s, err := quant.ParseScheme(name)
	if err != nil {
		panic(err)
	}
	return s
}

// EncodeLegacy writes, row by row, the bytes of QuantizeLegacy's tensor encoded, and reports a
// NaN with its row.
func TestEncodeLegacyMatchesQuantizeLegacy(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n, k = 7, 320
	w := randomWeights(r, n*k)
	rows := func(w []float32) func(int, []float32) ([]float32, error) {
		return func(row int, buf []float32) ([]float32, error) { return w[row*k : (row+1)*k], nil }
	}
	for _, typ := range []gguf.Type{gguf.Q8_0, gguf.Q5_0, gguf.Q4_0} {
		s := schemeOf(t, typ)
		q, err := ggmltype.QuantizeLegacy(w, n, k, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, want, err := ggmltype.Encode(q)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ggmltype.EncodeLegacy(s, n, k, rows(w))
		if err != nil || string(got) != string(want) {
			t.Fatalf("%s: %d bytes (%v), differ from QuantizeLegacy's %d", typ, len(got), err, len(want))
		}
		bad := append([]float32(nil), w...)
		bad[4*k+9] = float32(math.NaN())
		if _, err := ggmltype.EncodeLegacy(s, n, k, rows(bad)); err == nil || !strings.Contains(err.Error(), "row 4") {
			t.Errorf("%s with a NaN in row 4: %v", typ, err)
		}
	}
}

func schemeOf(t *testing.T, typ gguf.Type) quant.Scheme {
	for _, rung := range ggmltype.Rungs() {
		if rung.Type == typ {
			return rung.Scheme
		}
	}
	t.Fatalf("no rung for %s", typ)
	return quant.Scheme{}
}
