package quant_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/quanttest"
	"github.com/qpack-dev/qpack/quant"
)

func TestKQuantSchemeNames(t *testing.T) {
	want := map[string]quant.Scheme{
		"q2_k": {Grid: quant.KQuant, Bits: 2, GroupSize: 16},
		"q3_k": {Grid: quant.KQuant, Bits: 3, GroupSize: 16, Sym: true},
		"q4_k": {Grid: quant.KQuant, Bits: 4, GroupSize: 32},
		"q5_k": {Grid: quant.KQuant, Bits: 5, GroupSize: 32},
		"q6_k": {Grid: quant.KQuant, Bits: 6, GroupSize: 16, Sym: true},
	}
	for name, s := range want {
		got, err := quant.ParseScheme(strings.ToUpper(name))
		if err != nil || got != s {
			t.Errorf("ParseScheme(%q) = %+v, %v; want %+v", name, got, err, s)
		}
		if s.String() != name {
			t.Errorf("%+v.String() = %q, want %q", s, s.String(), name)
		}
		if err := s.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, c := range []struct{ name, err string }{
		{"q4_k-g64", "takes no group size"},
		{"q6_k-sym", "takes no group size"},
		{"q7_k", "2 to 6 bits"},
		{"q1_k", "2 to 6 bits"},
		{"qx_k", "unknown grid"},
	} {
		if _, err := quant.ParseScheme(c.name); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("ParseScheme(%q) = %v, want an error containing %q", c.name, err, c.err)
		}
	}
	for _, s := range []quant.Scheme{{Grid: quant.KQuant, Bits: 4, GroupSize: 16}, {Grid: quant.KQuant, Bits: 3, GroupSize: 16}, {Grid: quant.KQuant, Bits: 7, GroupSize: 16}} {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v validated", s)
		}
	}
}

func TestKQuantStoredScales(t *testing.T) {
	for bits := 2; bits <= 6; bits++ {
		s, _ := quant.KQuantScheme(bits)
		kt, _ := s.KQuant()
		for sc := kt.ScaleLo; sc <= kt.ScaleHi; sc++ {
			v := kt.StoredScale(int8(sc))
			if int(v) >= 1<<kt.ScaleBits || kt.LoadScale(v) != int8(sc) {
				t.Fatalf("%s: scale %d stored as %d, loaded as %d", s, sc, v, kt.LoadScale(v))
			}
		}
	}
	q3, _ := quant.KQuantScheme(3)
	q6, _ := quant.KQuantScheme(6)
	kt3, _ := q3.KQuant()
	kt6, _ := q6.KQuant()
	if kt3.StoredScale(-32) != 0 || kt3.StoredScale(31) != 63 || kt6.StoredScale(-1) != 0xff {
		t.Error("q3_k scales must be stored +32 and q6_k's as two's complement")
	}
}

// The hand-worked values use parameters that make every float32 step exact.
func TestKQuantDequantizeByHand(t *testing.T) {
	q4, _ := quant.KQuantScheme(4)
	// q4_k, K = 288: one whole super-block and a partial one of one sub-block.
	tn := quant.NewKQuantTensor(q4, 1, 288)
	tn.Scales[0], tn.Scales[1] = 0.5, 2
	tn.Mins[0], tn.Mins[1] = 0.25, 1
	tn.SubScales[0], tn.SubMins[0] = 3, 2
	tn.SubScales[7], tn.SubMins[7] = 63, 63
	tn.SubScales[8], tn.SubMins[8] = 1, 5
	tn.Codes[0], tn.Codes[31], tn.Codes[255], tn.Codes[256], tn.Codes[287] = 15, 4, 1, 7, 0
	want := map[int]float32{0: 0.5*3*15 - 0.25*2, 31: 0.5*3*4 - 0.5, 32: 0, 255: 0.5*63 - 0.25*63, 256: 2*7 - 5, 287: -5}
	checkKValues(t, tn, want)

	q3, _ := quant.KQuantScheme(3) // negative d, the most negative scale; code q means q − 4
	tn = quant.NewKQuantTensor(q3, 2, 32)
	tn.Scales[1] = -0.5
	tn.SubScales[2], tn.SubScales[3] = -32, 31
	tn.Codes[32], tn.Codes[47], tn.Codes[48] = 0, 7, 4
	checkKValues(t, tn, map[int]float32{0: 0, 32: -0.5 * -32 * -4, 47: -0.5 * -32 * 3, 48: 0, 49: -0.5 * 31 * -4})

	q6, _ := quant.KQuantScheme(6) // int8 scales; code q means q − 32
	tn = quant.NewKQuantTensor(q6, 1, 16)
	tn.Scales[0], tn.SubScales[0] = 0.125, -128
	tn.Codes[0], tn.Codes[1], tn.Codes[2] = 0, 63, 32
	checkKValues(t, tn, map[int]float32{0: 0.125 * -128 * -32, 1: 0.125 * -128 * 31, 2: 0})

	q2, _ := quant.KQuantScheme(2)
	tn = quant.NewKQuantTensor(q2, 1, 32)
	tn.Scales[0], tn.Mins[0] = 1, 0.5
	tn.SubScales[1], tn.SubMins[1], tn.SubMins[0] = 15, 15, 1
	tn.Codes[16], tn.Codes[0] = 3, 3
	checkKValues(t, tn, map[int]float32{0: -0.5, 16: 45 - 7.5, 17: -7.5})
}

func checkKValues(t *testing.T, tn *quant.Tensor, want map[int]float32) {
	t.Helper()
	if err := tn.Validate(); err != nil {
		t.Fatalf("%s: %v", tn.Scheme, err)
	}
	got := tn.Dequantize(nil)
	for i, w := range want {
		if got[i] != w {
			t.Errorf("%s: weight %d = %v, want %v", tn.Scheme, i, got[i], w)
		}
	}
}

// Dequantize and DequantizeRows must give each weight the formula's float32 value, computed
// here weight by weight from its own indices.
func TestKQuantDequantizeRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for bits := 2; bits <= 6; bits++ {
		s, _ := quant.KQuantScheme(bits)
		kt, _ := s.KQuant()
		for _, k := range []int{kt.Sub, 256, 512 + 3*kt.Sub} {
			tn := quanttest.RandomKQuant(r, s, 3, k)
			if err := tn.Validate(); err != nil {
				t.Fatal(err)
			}
			got := tn.Dequantize(nil)
			rows := make([]float32, k)
			tn.DequantizeRows(rows, 2, 3)
			for i, v := range got {
				n, col := i/k, i%k
				sub := n*(k/kt.Sub) + col/kt.Sub
				blk := n*s.SuperBlocks(k) + col/quant.SuperBlock
				dl := tn.Scales[blk] * float32(tn.SubScales[sub])
				var want float32
				if kt.Mins {
					want = float32(dl*float32(tn.Codes[i])) - float32(tn.Mins[blk]*float32(tn.SubMins[sub]))
				} else {
					want = dl * float32(int(tn.Codes[i])-kt.Offset)
				}
				if math.Float32bits(v) != math.Float32bits(want) {
					t.Fatalf("%s K=%d weight %d: %v, want %v", s, k, i, v, want)
				}
				if n == 2 && math.Float32bits(rows[col]) != math.Float32bits(v) {
					t.Fatalf("%s: DequantizeRows differs at column %d", s, col)
				}
			}
		}
	}
}

func TestKQuantValidateRejects(t *testing.T) {
	q4, _ := quant.KQuantScheme(4)
	q3, _ := quant.KQuantScheme(3)
	q2, _ := quant.KQuantScheme(2)
	cases := []struct {
		s      quant.Scheme
		want   string
		mutate func(*quant.Tensor)
	}{
		{q4, "K = 48 is not a multiple of its sub-block of 32", func(t *quant.Tensor) { *t = *quant.NewKQuantTensor(q4, 2, 48) }},
		{q4, "no act-order", func(t *quant.Tensor) { t.GIdx = make([]int32, t.K) }},
		{q4, "codes: have 10", func(t *quant.Tensor) { t.Codes = t.Codes[:10] }},
		{q4, "scales (d): have 3", func(t *quant.Tensor) { t.Scales = t.Scales[:3] }},
		{q4, "mins (dmin): have 0", func(t *quant.Tensor) { t.Mins = nil }},
		{q3, "mins (dmin): have 2", func(t *quant.Tensor) { t.Mins = make([]float32, 2) }},
		{q4, "sub-block scales: have 1", func(t *quant.Tensor) { t.SubScales = t.SubScales[:1] }},
		{q4, "sub-block mins: have 0", func(t *quant.Tensor) { t.SubMins = nil }},
		{q4, "zeros: have 1", func(t *quant.Tensor) { t.Zeros = []uint8{0} }},
		{q4, "code 0x10 at row 1, column 5", func(t *quant.Tensor) { t.Codes[t.K+5] = 16 }},
		{q4, "super-block scale NaN at row 1, super-block 1", func(t *quant.Tensor) { t.Scales[3] = float32(math.NaN()) }},
		{q4, "super-block scale +Inf at row 0, super-block 0", func(t *quant.Tensor) { t.Mins[0] = float32(math.Inf(1)) }},
		{q4, "sub-block scale 64 at row 0, sub-block 3", func(t *quant.Tensor) { t.SubScales[3] = 64 }},
		{q4, "sub-block scale -1 at row 0, sub-block 3", func(t *quant.Tensor) { t.SubScales[3] = -1 }},
		{q4, "sub-block min 64 at row 1, sub-block 0", func(t *quant.Tensor) { t.SubMins[t.K/32] = 64 }},
		{q3, "sub-block scale 32 at row 0, sub-block 2", func(t *quant.Tensor) { t.SubScales[2] = 32 }},
		{q3, "sub-block scale -33", func(t *quant.Tensor) { t.SubScales[2] = -33 }},
		{q2, "sub-block scale 16", func(t *quant.Tensor) { t.SubScales[0] = 16 }},
		{q2, "sub-block min 16", func(t *quant.Tensor) { t.SubMins[0] = 16 }},
	}
	for _, c := range cases {
		tn := quant.NewKQuantTensor(c.s, 2, 320)
		if err := tn.Validate(); err != nil {
			t.Fatalf("%s: %v", c.s, err)
		}
		c.mutate(tn)
		if err := tn.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.s, err, c.want)
		}
	}
	plain := quant.Tensor{Scheme: quant.Scheme{Bits: 4, GroupSize: 8}, N: 1, K: 8, Codes: make([]uint8, 8), Scales: []float32{1}, Zeros: []uint8{0}, SubScales: []int8{1}}
	if err := plain.Validate(); err == nil || !strings.Contains(err.Error(), "k-quants and IQ types only") {
		t.Errorf("sub-block scales on an integer tensor: %v", err)
	}
}
