package gptq

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// clipPow and its parts reproduce math.Pow(d, 2.4), math.Log and math.Exp bit for bit on this
// machine, with the Exp path clipPowPath finds (run also with GODEBUG=cpu.fma=off for the
// other path), on fresh random inputs over the whole range and on the edge cases.
func TestClipPowMatchesMathPow(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		if _, ok := clipPowPath(); ok {
			t.Errorf("clipPowPath claims to reproduce math.Pow on %s", runtime.GOARCH)
		}
		t.Skip("the port is of amd64's math.Pow")
	}
	fma, ok := clipPowPath()
	if !ok {
		t.Fatal("clipPowPath: math.Pow matches neither Exp path")
	}
	t.Logf("math.Exp takes its FMA path: %v", fma)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	edges := []float64{0, 1, math.Inf(1), math.NaN(), 0.5, 2, math.SmallestNonzeroFloat32, math.MaxFloat32,
		0x1.6a09e667f3bcdp-1, 0x1.6a09e667f3bcdp+3, 0x1.6a09e667f3bcep-1, 1 - 0x1p-53, 1 + 0x1p-52}
	check := func(d float64) {
		if got, want := clipPow(d, fma), math.Pow(d, 2.4); math.Float64bits(got) != math.Float64bits(want) && !(got != got && want != want) {
			t.Fatalf("clipPow(%v) = %v, math.Pow %v", d, got, want)
		}
		if got, want := amd64Log(d), math.Log(d); math.Float64bits(got) != math.Float64bits(want) && !(got != got && want != want) {
			t.Fatalf("amd64Log(%v) = %v, math.Log %v", d, got, want)
		}
	}
	for _, d := range edges {
		check(d)
	}
	for range 200000 {
		// |Q(w) − w| as the search computes it: a float32 difference, of any magnitude.
		check(float64(float32(math.Ldexp(r.Float64()+0.5, r.IntN(300)-170))))
		check(math.Ldexp(r.Float64()+0.5, r.IntN(2100)-1075))
	}
	for range 200000 {
		x := (r.Float64() - 0.5) * 1500
		if r.IntN(4) == 0 {
			x = math.Ldexp(r.Float64()-0.5, r.IntN(80)-60)
		}
		if got, want := amd64Exp(x, fma), math.Exp(x); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("amd64Exp(%v) = %v, math.Exp %v", x, got, want)
		}
	}
	for _, x := range []float64{-745.2, -740, -708.5, 709.78, 709.79, -1e10, 1e10, math.Inf(-1), math.Inf(1), -0x1p-1074} {
		if got, want := amd64Exp(x, fma), math.Exp(x); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("amd64Exp(%v) = %v, math.Exp %v", x, got, want)
		}
	}
}
