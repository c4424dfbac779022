package gptq

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// The zero Options are the documented defaults: the same codes, scales and damping as
// spelling the defaults out.
func TestZeroOptionsAreDefaults(t *testing.T) {
	const n, k = 16, 256
	w := randomWeights(rand.New(rand.NewPCG(3, 3)), n, k)
	h := kmsHessian(k)
	s := quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}
	zero, zst, err := Quantize(w, n, k, h, s, Options{})
	if err != nil {
		t.Fatalf("Quantize with Options{}: %v", err)
	}
	spelled, sst, err := Quantize(w, n, k, h, s, Options{Damp: DefaultDamp, MaxDamp: DefaultMaxDamp, BlockSize: DefaultBlockSize})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(zero.Codes, spelled.Codes) || !slices.Equal(zero.Scales, spelled.Scales) {
		t.Error("Options{} quantizes differently from the spelled-out defaults")
	}
	if zst.Damp != DefaultDamp || sst.Damp != zst.Damp {
		t.Errorf("damping %g with Options{}, %g spelled out; want %g", zst.Damp, sst.Damp, DefaultDamp)
	}
}
