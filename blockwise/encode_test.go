package blockwise

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// randomPositiveF16 returns a random positive finite F16 value, subnormals included.
func randomPositiveF16(r *rand.Rand) float32 {
	for {
		s := fp.F16ToF32(uint16(r.IntN(0x7c00)))
		if s > 0 {
			return s
		}
	}
}

// randomQuotientWeight returns a weight whose quotient by scale is spread over the codes and
// beyond them: uniform multiples of the scale, exact ties and their float32 neighbours, BF16
// roundings of those (BF16 inputs make exact ties common), and, when wild, arbitrary bit
// patterns.
func randomQuotientWeight(r *rand.Rand, scale float32, wild bool) float32 {
	j := float32(r.IntN(700) - 350)
	kind := r.IntN(6)
	if !wild && kind == 3 {
		kind = 0
	}
	switch kind {
	case 0:
		return (j + 0.5) * scale
	case 1:
		return math.Nextafter32((j+0.5)*scale, float32(r.IntN(2)*2-1))
	case 2:
		return fp.BF16ToF32(fp.F32ToBF16((j + r.Float32()) * scale))
	case 3:
		return math.Float32frombits(r.Uint32()&^0x7f800000 | uint32(r.IntN(254)+1)<<23) // finite, any magnitude
	default:
		return (j + r.Float32()) * scale
	}
}

// The reciprocal encoder must give exactly the codes of the true float32 division (and of
// quant.QuantizeInt) on 10^8 random weights (10^6 with -short).
func TestIntEncodeMatchesDivisionOnRandomValues(t *testing.T) {
	total := 100_000_000
	if testing.Short() {
		total = 1_000_000
	}
	r := rand.New(rand.NewPCG(21, 22))
	const chunk = 4096
	w := make([]float32, chunk)
	codes := make([]uint8, chunk)
	for done := 0; done < total; done += chunk {
		s := quant.Scheme{Bits: []int{2, 3, 4, 8}[r.IntN(4)], GroupSize: 128}
		q := intQuantizer{s}
		scale, wild := randomPositiveF16(r), r.IntN(4) == 0
		for i := range w {
			w[i] = randomQuotientWeight(r, scale, wild)
		}
		// small as intQuantizer.fit sets it: false for most wild chunks.
		pr := params{scale: scale, zero: uint8(r.IntN(s.MaxQ() + 1)), small: minMax(w).absMax() < scale*(1<<20)}
		if !wild && !pr.small {
			t.Fatalf("chunk of tame weights for scale %g is not small", scale)
		}
		q.encode(codes, w, pr)
		for i, v := range w {
			if want := s.QuantizeInt(v, pr.scale, pr.zero); codes[i] != want {
				t.Fatalf("%s scale %g zero %d: w %g (%#x) → %d, division gives %d", s, pr.scale, pr.zero, v, math.Float32bits(v), codes[i], want)
			}
		}
	}
}

// segment must decode any column range, including ones not a multiple of four long.
func TestBF16SegmentAnyRange(t *testing.T) {
	const k = 37
	raw := randomBF16(3, k, 23)
	src := bf16Rows{raw: raw, k: k}
	buf := make([]float32, k)
	for row := range 3 {
		for lo := 0; lo < k; lo++ {
			for hi := lo; hi <= k; hi++ {
				got := src.segment(row, lo, hi, buf)
				for i, v := range got {
					j := 2 * (row*k + lo + i)
					if want := fp.BF16ToF32(uint16(raw[j]) | uint16(raw[j+1])<<8); math.Float32bits(v) != math.Float32bits(want) {
						t.Fatalf("row %d [%d, %d): value %d = %v, want %v", row, lo, hi, i, v, want)
					}
				}
				if len(got) != hi-lo {
					t.Fatalf("row %d [%d, %d): %d values", row, lo, hi, len(got))
				}
			}
		}
	}
}

// spanned must give segment's values and exactly minMax's span for any range, with NaN and
// infinities anywhere making the span non-finite.
func TestBF16SpannedMatchesMinMax(t *testing.T) {
	const k = 37
	raw := randomBF16(3, k, 29)
	specials := []uint16{0x7fc0, 0x7f80, 0xff80, 0x8000, 0xffc1} // NaN, +Inf, −Inf, −0, −NaN
	for i, v := range specials {
		j := 2 * (5 + 23*i)
		raw[j], raw[j+1] = byte(v), byte(v>>8)
	}
	src := bf16Rows{raw: raw, k: k}
	buf, ref := make([]float32, k), make([]float32, k)
	for row := range 3 {
		for lo := 0; lo < k; lo++ {
			for hi := lo; hi <= k; hi++ {
				want := minMax(src.segment(row, lo, hi, ref))
				got, r := src.spanned(row, lo, hi, buf)
				if len(got) != hi-lo || !sameSpan(r, want) {
					t.Fatalf("row %d [%d, %d): span %v, minMax %v", row, lo, hi, r, want)
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(ref[i]) {
						t.Fatalf("row %d [%d, %d): value %d differs", row, lo, hi, i)
					}
				}
			}
		}
	}
}

func sameSpan(a, b span) bool {
	if a.finite() != b.finite() {
		return false
	}
	return !a.finite() || (math.Float32bits(a.lo) == math.Float32bits(b.lo) && math.Float32bits(a.hi) == math.Float32bits(b.hi))
}
