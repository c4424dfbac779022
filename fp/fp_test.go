package fp

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/x448/float16"
)

// x448/float16 is an independent, exhaustively checked F16 implementation: our decode must
// match it on every bit pattern and our encode on every float32 we throw at it.
func TestF16AgainstX448(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		want := float16.Frombits(uint16(i)).Float32()
		got := F16ToF32(uint16(i))
		if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", i, got, want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	check := func(f float32) {
		want := float16.Fromfloat32(f).Bits()
		if got := F32ToF16(f); got != want && !(f != f) {
			t.Fatalf("F32ToF16(%g [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	for i := 0; i < 2_000_000; i++ {
		check(math.Float32frombits(r.Uint32()))
		check(float32(r.NormFloat64() * 0.02))
	}
	// Every half value and the midpoints between neighbours (ties) round as x448 does.
	for i := 0; i < 0x7c00; i++ {
		lo, hi := float64(F16ToF32(uint16(i))), float64(F16ToF32(uint16(i+1)))
		check(float32(lo))
		check(float32((lo + hi) / 2))
		check(-float32((lo + hi) / 2))
	}
}

func TestBF16(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, even stays
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, odd rounds up
		{math.Float32frombits(0x3f808001), 0x3f81},
		{float32(math.Inf(1)), 0x7f80},
		{math.MaxFloat32, 0x7f80}, // rounds up to Inf
	}
	for _, c := range cases {
		if got := F32ToBF16(c.in); got != c.want {
			t.Errorf("F32ToBF16(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if v := BF16ToF32(F32ToBF16(float32(math.NaN()))); v == v {
		t.Errorf("NaN did not survive BF16")
	}
	for i := 0; i < 1<<16; i++ {
		f := BF16ToF32(uint16(i))
		if f == f && F32ToBF16(f) != uint16(i) {
			t.Fatalf("BF16 round trip of %#04x failed", i)
		}
	}
}

// The FP8 formats are checked by exhaustive round trips and a few values from the OCP spec.
func TestFP8(t *testing.T) {
	known := map[uint8]float32{0x7e: 448, 0x08: 1.0 / 64, 0x01: 1.0 / 512, 0x38: 1, 0xb8: -1, 0x00: 0}
	for b, want := range known {
		if got := E4M3ToF32(b); got != want {
			t.Errorf("E4M3ToF32(%#02x) = %v, want %v", b, got, want)
		}
	}
	for i := 0; i < 256; i++ {
		f := E4M3ToF32(uint8(i))
		if f != f {
			continue
		}
		if got := F32ToE4M3(f); got != uint8(i) && !(f == 0 && got&0x7f == 0) {
			t.Errorf("E4M3 round trip %#02x -> %v -> %#02x", i, f, got)
		}
		g := E5M2ToF32(uint8(i))
		if g == g && F32ToE5M2(g) != uint8(i) {
			t.Errorf("E5M2 round trip %#02x -> %v -> %#02x", i, g, F32ToE5M2(g))
		}
	}
	if F32ToE4M3(1e6) != 0x7e || F32ToE4M3(-1e6) != 0xfe {
		t.Errorf("E4M3 does not saturate")
	}
	// Halfway between 1 and the next E4M3 value (1.125) is a tie that goes to even (1).
	if got := F32ToE4M3(1.0625); got != 0x38 {
		t.Errorf("E4M3 tie: got %#02x", got)
	}
	if got := F32ToE4M3(1.0626); got != 0x39 {
		t.Errorf("E4M3 above tie: got %#02x", got)
	}
	if E5M2ToF32(0x7c) != float32(math.Inf(1)) || E5M2ToF32(0x3c) != 1 {
		t.Errorf("E5M2 decode wrong")
	}
	if E8M0ToF32(127) != 1 || E8M0ToF32(130) != 8 || E8M0ToF32(0xff) == E8M0ToF32(0xff) {
		t.Errorf("E8M0 decode wrong")
	}
}

func TestFNUZAndF4(t *testing.T) {
	// FNUZ formats have one more exponent bias than the FN/IEEE ones: the same bits are half.
	if E4M3FNUZToF32(0x40) != 1 || E5M2FNUZToF32(0x40) != 1 {
		t.Errorf("FNUZ one: %v %v", E4M3FNUZToF32(0x40), E5M2FNUZToF32(0x40))
	}
	if v := E4M3FNUZToF32(0x80); v == v {
		t.Errorf("0x80 must be NaN in FNUZ")
	}
	if E4M3FNUZToF32(0x7f) != 240 {
		t.Errorf("E4M3FNUZ max = %v, want 240", E4M3FNUZToF32(0x7f))
	}
	want := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}
	for i, w := range want {
		if got := F4E2M1ToF32(uint8(i)); got != w {
			t.Errorf("F4E2M1ToF32(%d) = %v, want %v", i, got, w)
		}
	}
}

func TestFirstNonFinite(t *testing.T) {
	for _, n := range []int{0, 1, 1000, 3<<20 + 17} {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%7) - 3
		}
		if got := FirstNonFinite(v); got != -1 {
			t.Errorf("n=%d finite: got %d", n, got)
		}
		if n == 0 {
			continue
		}
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			for _, at := range []int{n - 1, n / 2, n * 2 / 3} {
				w := slices.Clone(v)
				w[at], w[n-1] = bad, bad
				if got := FirstNonFinite(w); got != at {
					t.Errorf("n=%d, %v at %d and %d: got %d", n, bad, at, n-1, got)
				}
			}
		}
	}
	if got := FirstNonFinite([]float32{math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32}); got != -1 {
		t.Errorf("extreme finite values: got %d", got)
	}
}

// bruteE2M1 is the nearest E2M1 magnitude code by exhaustive search in float64, a tie going to
// the even code; the sign comes from f.
func bruteE2M1(f float32) uint8 {
	a := math.Abs(float64(f))
	best, bestD := 0, math.Inf(1)
	for i := range 8 {
		d := math.Abs(a - float64(F4E2M1ToF32(uint8(i))))
		if d < bestD || (d == bestD && i%2 == 0) {
			best, bestD = i, d
		}
	}
	if best == 0 {
		return 0 // zero is +0, whatever the sign
	}
	return uint8(math.Float32bits(f)>>31)<<3 | uint8(best)
}

func TestF32ToE2M1(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	var xs []float32
	for range 200000 {
		xs = append(xs, float32(r.Float64()*16-8))
	}
	for i := range 8 { // every value, every midpoint and their float32 neighbours
		v := F4E2M1ToF32(uint8(i))
		xs = append(xs, v, -v, math.Nextafter32(v, 10), math.Nextafter32(v, -10))
		if i < 7 {
			mid := (v + F4E2M1ToF32(uint8(i+1))) / 2
			xs = append(xs, mid, -mid, math.Nextafter32(mid, 10), math.Nextafter32(mid, -10))
		}
	}
	xs = append(xs, 100, -100, 1e6, float32(math.Copysign(0, -1)))
	for _, x := range xs {
		if got, want := F32ToE2M1(x), bruteE2M1(x); got != want {
			t.Fatalf("F32ToE2M1(%v) = %#x, brute force %#x", x, got, want)
		}
	}
	// Ties to even, as compressed-tensors' cast_to_fp4 rounds them.
	for x, want := range map[float32]uint8{0.25: 0, 0.75: 2, 1.25: 2, 1.75: 4, 2.5: 4, 3.5: 6, 5: 6, -0.75: 10, -0.25: 0, 7: 7, float32(math.Inf(-1)): 15} {
		if got := F32ToE2M1(x); got != want {
			t.Errorf("F32ToE2M1(%v) = %d, want %d", x, got, want)
		}
	}
}

// ExactF16 says exactly which float32 values are finite F16 values and encodes them as
// F32ToF16 does: every F16 value, its float32 neighbours, and random float32 bit patterns.
func TestExactF16(t *testing.T) {
	check := func(f float32) {
		h, ok := ExactF16(f)
		want := F32ToF16(f)
		wantOK := F16ToF32(want) == f && !math.IsInf(float64(f), 0)
		if ok != wantOK || ok && h != want {
			t.Fatalf("ExactF16(%g, %#08x) = %#04x, %v; want %#04x, %v", f, math.Float32bits(f), h, ok, want, wantOK)
		}
	}
	for i := 0; i < 1<<16; i++ {
		f := F16ToF32(uint16(i))
		check(f)
		check(math.Nextafter32(f, float32(math.Inf(1))))
		check(math.Nextafter32(f, float32(math.Inf(-1))))
	}
	r := rand.New(rand.NewPCG(7, 8))
	for range 1_000_000 {
		check(math.Float32frombits(r.Uint32()))
	}
}

// DecodeBF16 decodes every length, including ones that are not a multiple of four.
func TestDecodeBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	src := make([]byte, 2*37)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	for n := range 38 {
		dst := make([]float32, n)
		DecodeBF16(dst, src)
		for i, v := range dst {
			if want := BF16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8); math.Float32bits(v) != math.Float32bits(want) {
				t.Fatalf("length %d, value %d: %#08x, want %#08x", n, i, math.Float32bits(v), math.Float32bits(want))
			}
		}
	}
}

func BenchmarkDecodeBF16(b *testing.B) {
	src := make([]byte, 2<<16)
	dst := make([]float32, 1<<16)
	b.Run("four-per-load", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			DecodeBF16(dst, src)
		}
	})
	b.Run("one-per-value", func(b *testing.B) {
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			for i := range dst {
				dst[i] = BF16ToF32(uint16(src[2*i]) | uint16(src[2*i+1])<<8)
			}
		}
	})
}

// BenchmarkFirstNonFinite scans 45M finite values (a 7B MLP weight) on one goroutine, in GB/s
// of float32s read.
func BenchmarkFirstNonFinite(b *testing.B) {
	v := make([]float32, 45<<20)
	for i := range v {
		v[i] = float32(i%1000) - 500.5
	}
	b.SetBytes(int64(4 * len(v)))
	for range b.N {
		if firstNonFinite(v, 0) != -1 {
			b.Fatal("a finite value reported")
		}
	}
}

// TestFirstNonFiniteEveryPlace: the word-at-a-time scan finds a NaN or infinity of either sign
// at every place of short slices starting at every alignment, the first of two, and nothing in
// slices of finite values with every exponent (the largest finite ones included).
func TestFirstNonFiniteEveryPlace(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	finite := func() float32 {
		for {
			if x := math.Float32frombits(r.Uint32()); !nonFinite(x) {
				return x
			}
		}
	}
	bad := []uint32{0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x7f800001, 0xffffffff}
	backing := make([]float32, 64)
	for start := range 4 {
		for n := range 40 {
			v := backing[start : start+n]
			for i := range v {
				v[i] = finite()
			}
			if n > 0 {
				v[n/2] = math.MaxFloat32
			}
			if got := firstNonFinite(v, 7); got != -1 {
				t.Fatalf("start %d, n %d, finite: got %d", start, n, got)
			}
			for at := range n {
				for _, b := range bad {
					w := slices.Clone(v)
					w[at] = math.Float32frombits(b)
					w[n-1] = math.Float32frombits(bad[0])
					if got := firstNonFinite(w, 7); got != 7+at {
						t.Fatalf("start %d, n %d, %#08x at %d: got %d", start, n, b, at, got-7)
					}
				}
			}
		}
	}
}
