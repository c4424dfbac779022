package blockwise

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// The GPU kernels compute an integer code clamp(round(w/scale) + zero, 0, maxq) without a
// division per weight. For BF16 and F16 weights they use int_round_exact (checked on every
// weight/scale pair by the GPU test TestGPURoundExactExhaustive). For F32 weights they use
// int_code_fast (kernels/blockwise.cu), which this file mirrors: with r = 1/scale correctly
// rounded, x = fl(w·r) differs from the quotient q = fl(w/scale) by at most 3.0001 ulp-units
// of |x| (r, x and q each carry one rounding of relative size ≤ 2^-24), so round(x) = round(q)
// unless x lies within 3.0001·2^-24·|x| of a half-integer. The kernel rounds x by adding
// 1.5·2^23 (ties to even, exact for |x| < 2^22), measures x's distance to the nearest
// half-integer exactly, and redoes the weight with the true division when that distance is at
// most recipMargin·X (X ≥ |x| for the whole group), or when X ≥ recipLimit, or x is not finite.
// This file mirrors that arithmetic operation by operation and checks it against the
// reference quant.Scheme.QuantizeInt.
const (
	recipMagic  = 0x1.8p23 // ROUND_MAGIC
	recipMargin = 0x1p-21  // RECIP_MARGIN: 8·2^-24, over twice the 3.0001·2^-24 the bound needs
	recipLimit  = 0x1p21   // RECIP_LIMIT: beyond it the magic-number rounding is not trusted
)

// recipCutoff mirrors recip_cutoff: the largest |x − round(x)| the fast path accepts, for a
// group whose |w·r| are at most absX.
func recipCutoff(absX float32) float32 {
	thresh := float32(math.Inf(1))
	if absX < recipLimit {
		thresh = float32(absX * recipMargin)
	}
	return float32(0.5 - thresh)
}

// intRoundFast mirrors int_round_fast: clamp(round(w/scale), −zero, maxq − zero), and whether
// the kernel keeps it (else it recomputes the weight with the true division).
func intRoundFast(w, r, cutoff float32, zero uint8, maxq int) (n float32, fast bool) {
	x := float32(w * r)
	n = float32(float32(x+recipMagic) - recipMagic)
	fast = float32(math.Abs(float64(float32(x-n)))) < cutoff
	return max(min(n, float32(maxq-int(zero))), -float32(zero)), fast
}

// intCodeFast mirrors int_code_fast: the code read from the bits of n + zero + 1.5·2^23.
func intCodeFast(w, r, cutoff float32, zero uint8, maxq int) (code uint8, fast bool) {
	n, fast := intRoundFast(w, r, cutoff, zero, maxq)
	t := float32(n + float32(recipMagic+float32(zero)))
	return uint8(math.Float32bits(t) - math.Float32bits(recipMagic)), fast
}

// checkRecip compares the fast path with the reference for one weight and returns whether the
// fast path was taken; a wrong fast result fails the test.
func checkRecip(t *testing.T, s quant.Scheme, w, scale, absX float32, zero uint8) bool {
	r := float32(1 / scale)
	code, fast := intCodeFast(w, r, recipCutoff(absX), zero, s.MaxQ())
	if fast {
		if want := s.QuantizeInt(w, scale, zero); code != want {
			t.Fatalf("w=%g (%#x) scale=%g zero=%d bits=%d: fast code %d, reference %d (w/scale=%v, w*r=%v)",
				w, math.Float32bits(w), scale, zero, s.Bits, code, want, w/scale, w*r)
		}
	}
	return fast
}

var recipSchemes = []quant.Scheme{{Bits: 2}, {Bits: 3}, {Bits: 4}, {Bits: 8}}

// recipRandomScale is a positive finite F16 value, every exponent equally likely.
func recipRandomScale(r *rand.Rand) float32 {
	return fp.F16ToF32(uint16(1 + r.IntN(0x7bff)))
}

func TestRecipCodeRandom(t *testing.T) {
	total := 100_000_000
	if testing.Short() {
		total = 2_000_000
	}
	workers := runtime.GOMAXPROCS(0)
	var wg sync.WaitGroup
	var slowCount [64]int
	for id := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(id), 99))
			for range total / workers {
				s := recipSchemes[r.IntN(len(recipSchemes))]
				maxq := s.MaxQ()
				scale := recipRandomScale(r)
				zero := uint8(r.IntN(maxq + 1))
				// Quotients over the code range and a little past it; BF16 weights half the time
				// (what checkpoints hold), a few arbitrary bit patterns.
				q := (r.Float64()*1.4 - 0.7) * float64(maxq+2) * 2
				w := float32(q * float64(scale))
				kind := r.IntN(8)
				switch kind {
				case 0, 1, 2, 3:
					w = fp.BF16ToF32(fp.F32ToBF16(w))
				case 4:
					w = math.Float32frombits(r.Uint32()&^(0xff<<23) | uint32(r.IntN(0xff))<<23)
				}
				absX := float32(float32(math.Abs(float64(w))) * float32(1/scale))
				if !checkRecip(t, s, w, scale, absX, zero) && kind > 4 {
					slowCount[id]++
				}
			}
		}()
	}
	wg.Wait()
	slow := 0
	for _, c := range slowCount {
		slow += c
	}
	// Float32 weights in the code range (3/8 of the values) hit the margin with probability
	// about 2·recipMargin·|x| ≤ 2^-20·257 for 8 bits.
	t.Logf("%d values; %d of the float32 ones (%.2g) took the division", total, slow, float64(slow)/float64(total*3/8))
	if slow > total*3/8/1000 {
		t.Errorf("%d of %d float32 values took the slow path: the margin is far too wide", slow, total*3/8)
	}
}

// TestRecipCodeTies checks exact ties w/scale = k + 1/2 and their float32 neighbours, for every
// F16 scale exponent (normal and subnormal) and several mantissas: the values where rounding
// the product instead of the quotient would differ.
func TestRecipCodeTies(t *testing.T) {
	tested, fastTies := 0, 0
	for _, s := range recipSchemes {
		maxq := s.MaxQ()
		for exp := -24; exp <= 15; exp++ {
			for _, mant := range []float64{1, 1.5, 1.0009765625, 1.3330078125, 1.9990234375, 1.099609375} {
				scale := quant.RoundF16(float32(math.Ldexp(mant, exp)))
				if scale == 0 || math.IsInf(float64(scale), 0) {
					continue
				}
				for k := -maxq - 1; k <= maxq+1; k++ {
					tie := float32((float64(k) + 0.5) * float64(scale))
					w := tie
					for step := -3; step <= 3; step++ {
						if step == -3 {
							w = math.Nextafter32(math.Nextafter32(math.Nextafter32(tie, -1e30), -1e30), -1e30)
						} else {
							w = math.Nextafter32(w, 1e30)
						}
						if step < -2 {
							continue
						}
						for _, zero := range []uint8{0, uint8(maxq / 2), uint8(maxq)} {
							absX := float32(float32(math.Abs(float64(w))) * float32(1/scale))
							fast := checkRecip(t, s, w, scale, absX, zero)
							tested++
							if fast && float64(w)/float64(scale) == float64(k)+0.5 {
								fastTies++
							}
						}
					}
				}
			}
		}
	}
	if fastTies > 0 {
		t.Errorf("%d exact ties took the fast path; they must be divided", fastTies)
	}
	t.Logf("%d tie and near-tie values", tested)
}

// TestRecipCodeNonFinite checks that NaN and infinite weights, and groups whose scale overflowed
// to infinity, never take the fast path (the kernel reports them from the slow path).
func TestRecipCodeNonFinite(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	for _, c := range []struct{ w, scale, absX float32 }{
		{nan, 0.01, 5}, {inf, 0.01, inf}, {-inf, 0.01, inf}, {1, inf, nan}, {3e38, 6e-8, inf},
		{1e10, 0.001, 1e13},
	} {
		r := float32(1 / c.scale)
		if _, fast := intCodeFast(c.w, r, recipCutoff(c.absX), 8, 15); fast {
			t.Errorf("w=%v scale=%v absX=%v took the fast path", c.w, c.scale, c.absX)
		}
	}
}
