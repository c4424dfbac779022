package blockwise

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// randomWeights returns n×k Gaussian weights with a few large outliers, like LLM linears.
func randomWeights(n, k int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.02)
		if r.IntN(200) == 0 {
			w[i] *= 8
		}
	}
	return w
}

func mustQuantize(t *testing.T, w []float32, n, k int, s quant.Scheme, opt Options) *quant.Tensor {
	t.Helper()
	q, err := Quantize(w, n, k, s, opt)
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	if err := q.Validate(); err != nil {
		t.Fatalf("%s: output does not validate: %v", s, err)
	}
	return q
}

// groupBounds returns [lo, hi) of group g along K.
func groupBounds(s quant.Scheme, k, g int) (int, int) {
	gs := s.GroupSize
	if gs == quant.PerChannel || gs > k {
		gs = k
	}
	return g * gs, min((g+1)*gs, k)
}

// refIntGroup re-derives the GPTQ reference quantizer in float64 (quant.py: find_params and
// quantize), with the scale rounded to F16 as the golden files do. It returns the scale, the
// zero and the unrounded quotients w/scale.
func refIntGroup(w []float32, bits int, sym bool) (scale float64, zero int, quot []float64) {
	maxq := float64(int(1)<<bits - 1)
	xmin, xmax := 0.0, 0.0
	for _, v := range w {
		xmin, xmax = math.Min(xmin, float64(v)), math.Max(xmax, float64(v))
	}
	if sym {
		xmax = math.Max(-xmin, xmax)
		if xmin < 0 {
			xmin = -xmax
		}
	}
	if xmin == 0 && xmax == 0 {
		xmin, xmax = -1, 1
	}
	scale = float64(fp.F16ToF32(fp.F32ToF16(float32((xmax - xmin) / maxq))))
	if sym {
		zero = int(maxq+1) / 2
	} else {
		zero = int(math.RoundToEven(-xmin / scale))
	}
	for _, v := range w {
		quot = append(quot, float64(v)/scale)
	}
	return scale, zero, quot
}

func TestIntegerMatchesReferenceFormula(t *testing.T) {
	const n, k = 16, 300 // 300 = 2 full groups of 128 and a partial one of 44
	w := randomWeights(n, k, 1)
	for _, bits := range []int{2, 3, 4, 5, 6, 7, 8} {
		for _, sym := range []bool{false, true} {
			s := quant.Scheme{Bits: bits, GroupSize: 128, Sym: sym}
			q := mustQuantize(t, w, n, k, s, Options{})
			ambiguous := 0
			for row := range n {
				for g := range s.Groups(k) {
					lo, hi := groupBounds(s, k, g)
					scale, zero, quot := refIntGroup(w[row*k+lo:row*k+hi], bits, sym)
					i := row*s.Groups(k) + g
					if float64(q.Scales[i]) != scale || int(q.Zeros[i]) != zero {
						t.Fatalf("%s row %d group %d: scale, zero = %v, %d; reference %v, %d", s, row, g, q.Scales[i], q.Zeros[i], scale, zero)
					}
					for j, x := range quot {
						want := min(max(int(math.RoundToEven(x))+zero, 0), s.MaxQ())
						got := int(q.Codes[row*k+lo+j])
						if got == want {
							continue
						}
						// float32 division may round a quotient within an ulp of a half onto it.
						if math.Abs(math.Abs(x-math.Trunc(x))-0.5) > 1e-6*math.Abs(x) {
							t.Fatalf("%s row %d col %d: code %d, reference %d (w/scale = %v)", s, row, lo+j, got, want, x)
						}
						ambiguous++
					}
				}
			}
			if ambiguous > 2 {
				t.Errorf("%s: %d codes differ from the float64 reference at near-ties", s, ambiguous)
			}
		}
	}
}

func TestIntegerRoundTripBound(t *testing.T) {
	const n, k = 8, 256
	w := randomWeights(n, k, 2)
	for _, s := range []quant.Scheme{{Bits: 4, GroupSize: 64}, {Bits: 3, GroupSize: 128, Sym: true}, {Bits: 2, GroupSize: quant.PerChannel}} {
		q := mustQuantize(t, w, n, k, s, Options{})
		deq := q.Dequantize(nil)
		for i, v := range w {
			gi := (i/k)*s.Groups(k) + q.Group(i%k)
			scale, zero := q.Scales[gi], float32(q.Zeros[gi])
			lo, hi := scale*(0-zero), scale*(float32(s.MaxQ())-zero)
			if v < lo || v > hi {
				continue // clipped (symmetric top end): bounded by the range instead
			}
			if d := math.Abs(float64(v - deq[i])); d > float64(scale)/2*(1+1e-6) {
				t.Fatalf("%s element %d: |w − deq| = %v > scale/2 = %v", s, i, d, scale/2)
			}
		}
		if s.Sym {
			for _, z := range q.Zeros {
				if int(z) != 1<<(s.Bits-1) {
					t.Fatalf("%s: symmetric zero point %d, want %d", s, z, 1<<(s.Bits-1))
				}
			}
		}
	}
}

func TestPartialLastGroupUsesOnlyItsColumns(t *testing.T) {
	const n, k = 2, 136 // groups of 64: 64, 64, 8
	w := randomWeights(n, k, 3)
	w[1*k+130] = 5 // a huge weight in row 1's last group must not affect its other groups
	s := quant.Scheme{Bits: 4, GroupSize: 64}
	q := mustQuantize(t, w, n, k, s, Options{})
	if len(q.Scales) != n*3 {
		t.Fatalf("%d scales, want %d", len(q.Scales), n*3)
	}
	for row := range n {
		for g := range 3 {
			lo, hi := groupBounds(s, k, g)
			scale, zero := s.IntParams(w[row*k+lo : row*k+hi])
			if q.Scales[row*3+g] != scale || q.Zeros[row*3+g] != zero {
				t.Errorf("row %d group %d: %v/%d, want %v/%d", row, g, q.Scales[row*3+g], q.Zeros[row*3+g], scale, zero)
			}
		}
	}
	if q.Scales[1*3+2] < 5.0/15 || q.Scales[1*3+1] > 1 {
		t.Errorf("the outlier's scale did not stay in its group: %v", q.Scales[3:])
	}
}

func allSchemes() []quant.Scheme {
	return []quant.Scheme{
		{Bits: 4, GroupSize: 128}, {Bits: 4, GroupSize: 32, Sym: true}, {Bits: 8, GroupSize: quant.PerChannel, Sym: true},
		{Bits: 2, GroupSize: 64}, {Bits: 3, GroupSize: 128},
		{Bits: 4, GroupSize: 64, Sym: true, Grid: quant.NF4},
		{Bits: 8, Sym: true, Grid: quant.FP8E4M3},
		{Bits: 1, GroupSize: 64, Sym: true, Grid: quant.Binary}, {Bits: 1, GroupSize: 64, Grid: quant.Binary},
	}
}

func TestAllZeroGroups(t *testing.T) {
	const n, k = 3, 128
	w := randomWeights(n, k, 4)
	clear(w[k : 2*k]) // row 1 is all zero
	clear(w[:64])     // and row 0's first group of 64
	for _, s := range allSchemes() {
		for _, clip := range []bool{false, true} {
			q := mustQuantize(t, w, n, k, s, Options{Clip: clip})
			deq := q.Dequantize(nil)
			tol := 0.0
			if s.Grid == quant.Binary {
				tol = float64(quant.MinF16Scale) // sign codes cannot express 0
			}
			for i := k; i < 2*k; i++ {
				if math.Abs(float64(deq[i])) > tol {
					t.Fatalf("%s clip=%v: all-zero row dequantizes to %v at column %d", s, clip, deq[i], i-k)
				}
			}
			if s.GroupSize == 64 {
				for i := range 64 {
					if math.Abs(float64(deq[i])) > tol {
						t.Fatalf("%s: all-zero group dequantizes to %v", s, deq[i])
					}
				}
			}
		}
	}
}

func TestNF4MatchesBruteForce(t *testing.T) {
	const n, k = 4, 200
	w := randomWeights(n, k, 5)
	s := quant.Scheme{Bits: 4, GroupSize: 64, Sym: true, Grid: quant.NF4}
	q := mustQuantize(t, w, n, k, s, Options{})
	for i, v := range w {
		row, col := i/k, i%k
		g := col / 64
		lo, hi := groupBounds(s, k, g)
		absmax := 0.0
		for _, x := range w[row*k+lo : row*k+hi] {
			absmax = math.Max(absmax, math.Abs(float64(x)))
		}
		scale := q.Scales[row*s.Groups(k)+g]
		if scale != quant.RoundF16(float32(absmax)) {
			t.Fatalf("row %d group %d: scale %v, want F16(absmax %v)", row, g, scale, absmax)
		}
		x := float64(v / scale)
		best, bestD := 0, math.Inf(1)
		for c, nv := range quant.NF4Values {
			if d := math.Abs(x - float64(nv)); d < bestD {
				best, bestD = c, d
			}
		}
		if int(q.Codes[i]) != best {
			t.Fatalf("element %d: code %d, brute force %d (w/scale = %v)", i, q.Codes[i], best, x)
		}
	}
}

func TestBinarySign(t *testing.T) {
	const n, k = 2, 128
	w := randomWeights(n, k, 6)
	for _, sym := range []bool{true, false} {
		s := quant.Scheme{Bits: 1, GroupSize: 64, Sym: sym, Grid: quant.Binary}
		q := mustQuantize(t, w, n, k, s, Options{})
		for i, v := range w {
			gi := (i/k)*2 + (i%k)/64
			var offset float32
			if !sym {
				offset = q.Offsets[gi]
			}
			if want := v-offset >= 0; (q.Codes[i] == 1) != want {
				t.Fatalf("sym=%v element %d: code %d for w %v, offset %v", sym, i, q.Codes[i], v, offset)
			}
		}
		lo := 64
		wantScale, wantOffset := quant.BinaryParams(w[lo:lo+64], sym)
		if q.Scales[1] != wantScale || (!sym && q.Offsets[1] != wantOffset) {
			t.Errorf("sym=%v group 1: %v/%v, want %v/%v", sym, q.Scales[1], q.Offsets, wantScale, wantOffset)
		}
		// The L2-optimal sign scale beats a slightly different one.
		deq := q.Dequantize(nil)
		for _, f := range []float32{0.9, 1.1} {
			q2 := *q
			q2.Scales = append([]float32(nil), q.Scales...)
			for i := range q2.Scales {
				q2.Scales[i] *= f
			}
			if quant.RelativeError(w, q2.Dequantize(nil)) <= quant.RelativeError(w, deq) {
				t.Errorf("sym=%v: scale ×%v is not worse than mean|w|", sym, f)
			}
		}
	}
}

func TestFP8ExactOnRepresentableWeights(t *testing.T) {
	const n, k = 4, 64
	r := rand.New(rand.NewPCG(8, 9))
	w := make([]float32, n*k)
	rowScale := []float32{1.0 / 1024, 0.5, 3, 1.0 / (1 << 20)}
	for row := range n {
		for col := range k {
			c := uint8(r.IntN(256))
			if c&0x7f == 0x7f {
				c = 0
			}
			w[row*k+col] = rowScale[row] * fp.E4M3ToF32(c)
		}
		w[row*k+int(r.IntN(k))] = -448 * rowScale[row] // fixes absmax so scale = rowScale
	}
	q := mustQuantize(t, w, n, k, quant.Scheme{Bits: 8, Sym: true, Grid: quant.FP8E4M3}, Options{})
	deq := q.Dequantize(nil)
	for i := range w {
		if deq[i] != w[i] {
			t.Fatalf("element %d: %v dequantizes to %v (scale %v)", i, w[i], deq[i], q.Scales[i/k])
		}
	}
	for row, want := range rowScale {
		if q.Scales[row] != want {
			t.Errorf("row %d: scale %v, want %v", row, q.Scales[row], want)
		}
	}
}

// searchNormError is Σ imp·|w − deq|^2.4 over one group.
func searchNormError(w, deq, imp []float32) float64 {
	var sum float64
	for i := range w {
		e := math.Pow(math.Abs(float64(w[i]-deq[i])), clipNorm)
		if imp != nil {
			e *= float64(imp[i])
		}
		sum += e
	}
	return sum
}

func TestClipNeverWorseInSearchNorm(t *testing.T) {
	const n, k = 8, 256
	w := randomWeights(n, k, 10)
	r := rand.New(rand.NewPCG(11, 12))
	imp := make([]float32, k)
	for i := range imp {
		imp[i] = float32(r.ExpFloat64())
	}
	for _, s := range allSchemes() {
		for _, importance := range [][]float32{nil, imp} {
			plain := mustQuantize(t, w, n, k, s, Options{}).Dequantize(nil)
			clipped := mustQuantize(t, w, n, k, s, Options{Clip: true, Importance: importance}).Dequantize(nil)
			better := 0
			for row := range n {
				for g := range s.Groups(k) {
					lo, hi := groupBounds(s, k, g)
					var gimp []float32
					if importance != nil {
						gimp = importance[lo:hi]
					}
					a, b := row*k+lo, row*k+hi
					ep, ec := searchNormError(w[a:b], plain[a:b], gimp), searchNormError(w[a:b], clipped[a:b], gimp)
					if ec > ep*(1+1e-12) {
						t.Fatalf("%s row %d group %d: clipped error %v > plain %v", s, row, g, ec, ep)
					}
					if ec < ep {
						better++
					}
				}
			}
			if better == 0 && s.Grid != quant.Binary {
				t.Errorf("%s: clipping improved no group of heavy-tailed weights", s)
			}
		}
	}
}

func TestRejectsNonFiniteWithPosition(t *testing.T) {
	const n, k = 64, 2048 // large enough for several workers
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		w := randomWeights(n, k, 13)
		w[50*k+9] = bad
		w[37*k+17] = bad // the lower row is reported
		_, err := Quantize(w, n, k, quant.Scheme{Bits: 4, GroupSize: 128}, Options{})
		if err == nil || !strings.Contains(err.Error(), "row 37, column 17") {
			t.Errorf("float32 %v: got %v", bad, err)
		}
		raw := make([]byte, 2*n*k)
		for i, v := range w {
			b := fp.F32ToBF16(v)
			raw[2*i], raw[2*i+1] = byte(b), byte(b>>8)
		}
		_, err = QuantizeBF16(raw, n, k, quant.Scheme{Bits: 4, GroupSize: 128}, Options{})
		if err == nil || !strings.Contains(err.Error(), "row 37, column 17") {
			t.Errorf("bf16 %v: got %v", bad, err)
		}
	}
}

func TestRejectsBadArguments(t *testing.T) {
	w := make([]float32, 64)
	s := quant.Scheme{Bits: 4, GroupSize: 32}
	cases := []struct {
		want string
		err  error
	}{
		{"63 weights", func() error { _, err := Quantize(w[:63], 2, 32, s, Options{}); return err }()},
		{"shape 0x64", func() error { _, err := Quantize(nil, 0, 64, s, Options{}); return err }()},
		{"2 to 8 bits", func() error {
			_, err := Quantize(w, 2, 32, quant.Scheme{Bits: 9, GroupSize: 32}, Options{})
			return err
		}()},
		{"set Clip", func() error { _, err := Quantize(w, 2, 32, s, Options{Importance: make([]float32, 32)}); return err }()},
		{"31 importance weights", func() error {
			_, err := Quantize(w, 2, 32, s, Options{Clip: true, Importance: make([]float32, 31)})
			return err
		}()},
		{"channel 3 is -1", func() error {
			imp := make([]float32, 32)
			imp[3] = -1
			_, err := Quantize(w, 2, 32, s, Options{Clip: true, Importance: imp})
			return err
		}()},
		{"127 bytes of BF16", func() error { _, err := QuantizeBF16(make([]byte, 127), 2, 32, s, Options{}); return err }()},
		{"not finite in F16", func() error {
			big := make([]float32, 64)
			big[0] = 3e6 // range/15 > 65504
			_, err := Quantize(big, 2, 32, s, Options{})
			return err
		}()},
		{"not finite in F16", func() error { // every clipping candidate overflows too
			big := make([]float32, 64)
			big[0] = 3e7
			_, err := Quantize(big, 2, 32, s, Options{Clip: true})
			return err
		}()},
	}
	for _, c := range cases {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("want an error containing %q, got %v", c.want, c.err)
		}
	}
}

func TestBF16MatchesFloat32AndReusesBuffers(t *testing.T) {
	const n, k = 37, 520
	raw := randomBF16(n, k, 14)
	w := make([]float32, n*k)
	for i := range w {
		w[i] = fp.BF16ToF32(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8)
	}
	for _, s := range allSchemes() {
		var a, b quant.Tensor
		if err := QuantizeInto(&a, w, n, k, s, Options{}); err != nil {
			t.Fatal(err)
		}
		if err := QuantizeBF16Into(&b, raw, n, k, s, Options{}); err != nil {
			t.Fatal(err)
		}
		if !equalTensors(&a, &b) {
			t.Fatalf("%s: BF16 and float32 paths differ", s)
		}
		codes := &b.Codes[0]
		if err := QuantizeBF16Into(&b, raw, n, k, s, Options{}); err != nil || &b.Codes[0] != codes {
			t.Fatalf("%s: QuantizeBF16Into did not reuse dst (err %v)", s, err)
		}
		// Row by row, one worker each: the parallel split changes nothing.
		for row := range n {
			r := mustQuantize(t, w[row*k:(row+1)*k], 1, k, s, Options{})
			if string(r.Codes) != string(a.Codes[row*k:(row+1)*k]) {
				t.Fatalf("%s row %d: codes differ from the single-row result", s, row)
			}
		}
	}
}

func equalTensors(a, b *quant.Tensor) bool {
	eq := func(x, y []float32) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				return false
			}
		}
		return true
	}
	return a.Scheme == b.Scheme && a.N == b.N && a.K == b.K && string(a.Codes) == string(b.Codes) &&
		eq(a.Scales, b.Scales) && string(a.Zeros) == string(b.Zeros) && eq(a.Offsets, b.Offsets) &&
		eq(a.Mins, b.Mins) && slices.Equal(a.SubScales, b.SubScales) && string(a.SubMins) == string(b.SubMins) &&
		slices.Equal(a.Points, b.Points) && string(a.Signs) == string(b.Signs)
}

// The fast integer encoder (float32 rounding trick, clamping) must agree with the scalar
// quant.QuantizeInt on exact ties, near-ties, signed zeros and far out-of-range weights.
func TestIntEncodeMatchesQuantizeInt(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, s := range []quant.Scheme{{Bits: 4, GroupSize: 128}, {Bits: 2, GroupSize: 128, Sym: true}, {Bits: 8, GroupSize: 128}} {
		q := intQuantizer{s}
		for _, pr := range []params{{scale: 0.00390625, zero: 3}, {scale: quant.RoundF16(0.0123), zero: 0},
			{scale: quant.RoundF16(0.7), zero: 2}, {scale: quant.MinF16Scale, zero: 1}} {
			var w []float32
			for range 20000 {
				j := float32(r.IntN(600) - 300)
				tie := (j + 0.5) * pr.scale
				w = append(w, tie, math.Nextafter32(tie, 1e9), math.Nextafter32(tie, -1e9), j*pr.scale,
					float32(r.NormFloat64())*pr.scale*8)
			}
			w = append(w, 0, float32(math.Copysign(0, -1)), 1e30, -1e30, 3e38, -3e38)
			codes := make([]uint8, len(w))
			q.encode(codes, w, pr)
			for i, v := range w {
				if want := s.QuantizeInt(v, pr.scale, pr.zero); codes[i] != want {
					t.Fatalf("%s scale %v zero %d: w %v → %d, QuantizeInt %d", s, pr.scale, pr.zero, v, codes[i], want)
				}
			}
		}
	}
}
