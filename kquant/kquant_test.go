package kquant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/internal/quanttest"
	"github.com/qpack-dev/qpack/quant"
)

var ggmlTypes = map[int]gguf.Type{2: gguf.Q2_K, 3: gguf.Q3_K, 4: gguf.Q4_K, 5: gguf.Q5_K, 6: gguf.Q6_K}

func allTypes(t *testing.T) []*Type {
	var out []*Type
	for _, s := range quant.KQuantSchemes() {
		kt, err := TypeOf(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, kt)
	}
	return out
}

// randomRow draws weights of one of several shapes: normal, heavy-tailed, one-signed, sparse,
// tiny, constant and all zero, so that every branch of the fits runs.
func randomRow(r *rand.Rand, kind, k int) []float32 {
	w := make([]float32, k)
	for i := range w {
		g := r.NormFloat64()
		switch kind % 8 {
		case 0:
			w[i] = float32(0.02 * g)
		case 1:
			w[i] = float32(0.02 * g / math.Max(0.05, r.Float64()))
		case 2:
			w[i] = float32(math.Abs(g))
		case 3:
			w[i] = -float32(100 * math.Abs(g))
		case 4:
			if r.IntN(3) == 0 {
				w[i] = float32(g)
			}
		case 5:
			w[i] = float32(1e-6 * g)
		case 6:
			w[i] = 0.5
		case 7:
			w[i] = 0
		}
	}
	return w
}

func randomImportance(r *rand.Rand, k int) []float32 {
	imp := make([]float32, k)
	for i := range imp {
		imp[i] = float32(math.Exp(1.5 * r.NormFloat64()))
	}
	return imp
}

// quantizeRows fits a k-quant tensor of the given rows (imp nil: no importance).
func quantizeRows(t *testing.T, kt *Type, rows [][]float32, imp []float32) *quant.Tensor {
	t.Helper()
	q := quant.NewKQuantTensor(kt.Scheme, len(rows), len(rows[0]))
	for n, w := range rows {
		if err := kt.QuantizeRow(q, n, w, imp); err != nil {
			t.Fatalf("%s row %d: %v", kt.Scheme, n, err)
		}
	}
	if err := q.Validate(); err != nil {
		t.Fatalf("%s: fitted parameters out of range: %v", kt.Scheme, err)
	}
	return q
}

// The blocks AppendRow writes decode, through package gguf's decoders (ggml's
// dequantize_row_qX_K), to exactly the float32 values quant.Tensor.Dequantize gives.
func TestBlocksDecodeToDequantize(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, kt := range allTypes(t) {
		for _, withImp := range []bool{false, true} {
			const k = 512
			var rows [][]float32
			for i := range 16 {
				rows = append(rows, randomRow(r, i, k))
			}
			var imp []float32
			if withImp {
				imp = randomImportance(r, k)
			}
			q := quantizeRows(t, kt, rows, imp)
			want := q.Dequantize(nil)
			for n := range rows {
				b, err := kt.AppendRow(nil, q, n)
				if err != nil {
					t.Fatal(err)
				}
				if len(b) != 2*kt.BlockBytes() {
					t.Fatalf("%s: %d bytes for 512 weights", kt.Scheme, len(b))
				}
				got, err := gguf.Decode(nil, ggmlTypes[kt.Bits], b)
				if err != nil {
					t.Fatal(err)
				}
				for i, v := range got {
					if math.Float32bits(v) != math.Float32bits(want[n*k+i]) {
						t.Fatalf("%s importance %v row %d weight %d: ggml decodes %v, Dequantize %v", kt.Scheme, withImp, n, i, v, want[n*k+i])
					}
				}
			}
		}
	}
}

// Code and Value with the fitted parameters give back what the fit wrote (except in
// sub-blocks of scale 0, where ggml keeps the sub-block fit's codes and every code means the
// same): GPTQ can quantize weight by weight with parameters fitted once.
func TestCodeAndValueAgreeWithFit(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, kt := range allTypes(t) {
		for kind := range 8 {
			for _, n := range []int{256, 2 * kt.Sub} {
				w := randomRow(r, kind, n)
				codes := make([]uint8, n)
				var imp []float32
				if kind%2 == 1 {
					imp = randomImportance(r, n)
				}
				p, err := kt.Fit(w, imp, codes)
				if err != nil {
					t.Fatal(err)
				}
				q := quant.NewKQuantTensor(kt.Scheme, 1, n)
				copy(q.Codes, codes)
				kt.Put(q, 0, 0, &p)
				if got := kt.Get(q, 0, 0); got != p {
					t.Fatalf("%s: Get after Put = %+v, want %+v", kt.Scheme, got, p)
				}
				deq := q.Dequantize(nil)
				for i, v := range w {
					c := kt.Code(&p, i, v)
					if dl, _ := kt.subBlock(&p, i/kt.Sub); dl != 0 && c != codes[i] {
						t.Fatalf("%s kind %d weight %d: Code %d, fit %d", kt.Scheme, kind, i, c, codes[i])
					}
					if got := kt.Value(&p, i, codes[i]); math.Float32bits(got) != math.Float32bits(deq[i]) {
						t.Fatalf("%s weight %d: Value %v, Dequantize %v", kt.Scheme, i, got, deq[i])
					}
				}
			}
		}
	}
}

// With importance, the fit minimises the importance-weighted error, so that error is lower
// than without importance (summed over many super-blocks; single blocks may go either way).
func TestImportanceLowersWeightedError(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const k = 1024
	var rows [][]float32
	for range 64 {
		rows = append(rows, randomRow(r, 1, k))
	}
	imp := make([]float32, k)
	for i := range imp {
		imp[i] = float32(math.Exp(2 * r.NormFloat64())) // a few channels dominate, as real E[x²]
	}
	for _, kt := range allTypes(t) {
		plain := weightedError(quantizeRows(t, kt, rows, nil), rows, imp)
		weighted := weightedError(quantizeRows(t, kt, rows, imp), rows, imp)
		t.Logf("%s: weighted squared error %.4g without importance, %.4g with (%.0f%% lower)", kt.Scheme, plain, weighted, 100*(1-weighted/plain))
		if !(weighted < 0.95*plain) {
			t.Errorf("%s: importance-weighted error %.4g is not below %.4g without importance", kt.Scheme, weighted, plain)
		}
	}
}

func weightedError(q *quant.Tensor, rows [][]float32, imp []float32) float64 {
	deq := q.Dequantize(nil)
	var sum float64
	for n, w := range rows {
		for i, v := range w {
			d := float64(v - deq[n*q.K+i])
			sum += float64(imp[i]) * d * d
		}
	}
	return sum
}

// A row whose K is not a multiple of 256 ends in a shorter super-block; it is fitted as well as
// whole ones (relative error like a whole block's) and refused by AppendRow.
func TestPartialSuperBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, kt := range allTypes(t) {
		k := 384 + kt.Sub
		var rows [][]float32
		for range 8 {
			rows = append(rows, randomRow(r, 0, k))
		}
		q := quantizeRows(t, kt, rows, randomImportance(r, k))
		if len(q.Scales) != 8*2 {
			t.Fatalf("%s: %d super-block scales for 8 rows of %d", kt.Scheme, len(q.Scales), k)
		}
		deq := q.Dequantize(nil)
		var whole, tail, wholeN, tailN float64
		for n, w := range rows {
			for i, v := range w {
				d := float64(v - deq[n*k+i])
				if i < 256 {
					whole, wholeN = whole+d*d, wholeN+float64(v)*float64(v)
				} else {
					tail, tailN = tail+d*d, tailN+float64(v)*float64(v)
				}
			}
		}
		rw, rt := math.Sqrt(whole/wholeN), math.Sqrt(tail/tailN)
		if rt > 1.5*rw || rt > 0.5 {
			t.Errorf("%s: relative error %.3g in the short super-blocks against %.3g in whole ones", kt.Scheme, rt, rw)
		}
		if _, err := kt.AppendRow(nil, q, 0); err == nil || !strings.Contains(err.Error(), "not a multiple of 256") {
			t.Errorf("%s: AppendRow of K = %d: %v", kt.Scheme, k, err)
		}
	}
}

func TestFitRefusesBadInput(t *testing.T) {
	q4, _ := quant.KQuantScheme(4)
	kt, _ := TypeOf(q4)
	codes := make([]uint8, 512)
	with := func(n, i int, v float32) []float32 {
		w := make([]float32, n)
		w[i] = v
		return w
	}
	for _, c := range []struct {
		w, imp []float32
		want   string
	}{
		{make([]float32, 48), nil, "not 48"},
		{make([]float32, 512), nil, "at most 256"},
		{make([]float32, 64), make([]float32, 32), "64 weights with 512 codes and 32 importances"},
		{with(32, 5, float32(math.NaN())), nil, "weight 5 is NaN"},
		{with(64, 40, float32(math.Inf(-1))), nil, "weight 40 is -Inf"},
		{make([]float32, 32), with(32, 31, -1), "importance 31 is -1"},
		{make([]float32, 32), with(32, 3, float32(math.Inf(1))), "importance 3 is +Inf"},
	} {
		if _, err := kt.Fit(c.w, c.imp, codes); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Fit(%d weights): %v, want an error containing %q", len(c.w), err, c.want)
		}
	}
	row := make([]float32, 320)
	row[300] = float32(math.NaN())
	q := quant.NewKQuantTensor(q4, 1, 320)
	if err := kt.QuantizeRow(q, 0, row, nil); err == nil || !strings.Contains(err.Error(), "column 300 is NaN") {
		t.Errorf("QuantizeRow with a NaN: %v", err)
	}
	big := make([]float32, 256)
	big[7] = 3e38
	if err := kt.QuantizeRow(quant.NewKQuantTensor(q4, 1, 256), 0, big, nil); err == nil || !strings.Contains(err.Error(), "not finite in F16") {
		t.Errorf("QuantizeRow of weights beyond F16: %v", err)
	}
	if _, err := TypeOf(quant.Scheme{Bits: 4, GroupSize: 32}); err == nil {
		t.Error("TypeOf accepted int4-g32-asym")
	}
}

// decodeByHand reads element e of one ggml block b of type bits from ggml-common.h's layout
// (docs/reference/formats.md §5.2), bit by bit, in float64.
func decodeByHand(bits int, b []byte, e int) float64 {
	half := func(at int) float64 { return float64(fp.F16ToF32(binary.LittleEndian.Uint16(b[at:]))) }
	bit := func(at, i int) int { return int(b[at]>>i) & 1 }
	field := func(at, shift, width int) int { return int(b[at]>>shift) & (1<<width - 1) }
	h, r := e/128, e%128 // 128-weight half, position in it
	j := e / 16          // sub-block of 16
	switch bits {
	case 2: // scales[16] qs[64] d dmin
		q := field(16+32*h+r%32, 2*(r/32), 2)
		return half(80)*float64(field(j, 0, 4)*q) - half(82)*float64(field(j, 4, 4))
	case 3: // hmask[32] qs[64] scales[12] d
		q := field(32+32*h+r%32, 2*(r/32), 2) + 4*bit(e%32, e/32) - 4
		low := field(96+j%8, 4*(j/8), 4)
		sc := low + 16*field(104+j%4, 2*(j/4), 2) - 32
		return half(108) * float64(sc*q)
	case 4, 5: // d dmin scales[12] (qh[32]) qs[128]
		j = e / 32
		var sc, m int
		if j < 4 {
			sc, m = field(4+j, 0, 6), field(8+j, 0, 6)
		} else {
			sc = field(8+j, 0, 4) + 16*field(j, 6, 2)
			m = field(8+j, 4, 4) + 16*field(4+j, 6, 2)
		}
		qs := 16
		if bits == 5 {
			qs = 48
		}
		q := field(qs+32*(e/64)+e%32, 4*(j%2), 4)
		if bits == 5 {
			q += 16 * bit(16+e%32, j)
		}
		return half(0)*float64(sc*q) - half(2)*float64(m)
	default: // ql[128] qh[64] scales[16] d
		k, l := r/32, r%32
		q := field(64*h+l+32*(k%2), 4*(k/2), 4) + 16*field(128+32*h+l, 2*k, 2) - 32
		return half(208) * float64(int(int8(b[192+j]))*q)
	}
}

// TestHandWorkedBlocks builds one block per type with chosen parameters (d and dmin powers of
// two, so every product is exact) and codes cycling through the grid, and checks the bytes
// with a decoder written from the documented layout, weight by weight.
func TestHandWorkedBlocks(t *testing.T) {
	for _, kt := range allTypes(t) {
		q := quant.NewKQuantTensor(kt.Scheme, 1, 256)
		for i := range q.Codes {
			q.Codes[i] = uint8((7*i + i/16) % (kt.maxq + 1))
		}
		q.Scales[0] = 0.25
		if kt.Bits == 3 || kt.Bits == 6 {
			q.Scales[0] = -0.125 // q3_k and q6_k may have a negative d
		}
		for j := range q.SubScales {
			q.SubScales[j] = int8(kt.ScaleLo + (5*j+3)%(kt.ScaleHi-kt.ScaleLo+1))
		}
		if kt.Mins {
			q.Mins[0] = 0.5
			for j := range q.SubMins {
				q.SubMins[j] = uint8((3*j + 1) % (kt.MinHi + 1))
			}
		}
		if err := q.Validate(); err != nil {
			t.Fatal(err)
		}
		b, err := kt.AppendRow(nil, q, 0)
		if err != nil || len(b) != kt.BlockBytes() {
			t.Fatalf("%s: %d bytes, %v", kt.Scheme, len(b), err)
		}
		deq := q.Dequantize(nil)
		for e := range 256 {
			if want := decodeByHand(kt.Bits, b, e); float64(deq[e]) != want {
				t.Fatalf("%s weight %d: the block decodes by hand to %v, Dequantize gives %v", kt.Scheme, e, want, deq[e])
			}
		}
	}
}

// Round reads a weight's parameters from the tensor itself: for any row and column of a tensor
// of several rows and super-blocks (the last one short), it gives what Code and Value give with
// the parameters Get returns for that super-block.
func TestRoundReadsTheTensor(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 1))
	for _, kt := range allTypes(t) {
		const n, k = 3, 640
		q := quanttest.RandomKQuant(r, kt.Scheme, n, k)
		for range 2000 {
			row, col := r.IntN(n), r.IntN(k)
			w := float32(r.NormFloat64() * 0.05)
			p := kt.Get(q, row, col/quant.SuperBlock)
			code, value := kt.Round(q, row, col, w)
			if want := kt.Code(&p, col%quant.SuperBlock, w); code != want {
				t.Fatalf("%s row %d col %d: Round code %d, Code %d", kt.Scheme, row, col, code, want)
			}
			if want := kt.Value(&p, col%quant.SuperBlock, code); math.Float32bits(value) != math.Float32bits(want) {
				t.Fatalf("%s row %d col %d: Round value %v, Value %v", kt.Scheme, row, col, value, want)
			}
		}
	}
}
