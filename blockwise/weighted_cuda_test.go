package blockwise

import (
	"flag"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/quant"
)

// weightedGPUPTX lets a GPU run try kernels/weighted.cu compiled there before the embedded PTX
// is regenerated: go test -args -blockwise.weightedptx=/path/weighted.ptx
var weightedGPUPTX = flag.String("blockwise.weightedptx", "", "load this PTX instead of the embedded kernels/weighted.ptx")

func TestWeightedPTXIsFresh(t *testing.T) {
	if err := cuda.CheckPTX(weightedPTX, weightedSource); err != nil {
		t.Fatalf("kernels/weighted.ptx: %v", err)
	}
}

func openGPUImatrix(tb testing.TB) *GPUImatrix {
	tb.Helper()
	dev := gputest.Open(tb)
	g, err := newGPUImatrix(dev, gputest.PTX(tb, weightedPTX, *weightedGPUPTX))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	return g
}

// TestGPUWeightedMatchesCPU: on fresh random weights (heavy-tailed, with all-zero groups, −0 and
// groups of one value) and importance (skewed, with zeros, or none), the GPU search returns the
// CPU search's scales and zero points bit for bit, for every integer width, both symmetries,
// groups that end early, and per-channel; quantizing with them gives the CPU's tensor.
func TestGPUWeightedMatchesCPU(t *testing.T) {
	g := openGPUImatrix(t)
	const n, k = 37, 300
	schemes := []quant.Scheme{{Bits: 2, GroupSize: 64}, {Bits: 3, GroupSize: 128}, {Bits: 4, GroupSize: 32, Sym: true},
		{Bits: 4, GroupSize: 48}, {Bits: 5, GroupSize: 64}, {Bits: 6, GroupSize: 16, Sym: true}, {Bits: 8, GroupSize: 128},
		{Bits: 4, GroupSize: quant.PerChannel}, {Bits: 3, GroupSize: quant.PerChannel, Sym: true}}
	for seed, s := range schemes {
		w := randomWeights(n, k, uint64(100+seed))
		clear(w[5*k : 5*k+64])                   // an all-zero group
		w[7*k+3] = float32(math.Copysign(0, -1)) // −0
		for c := range 32 {
			w[9*k+c] = 0.01 // one value
		}
		imp := skewedImportance(k, uint64(200+seed))
		imp[11], imp[40] = 0, 0
		for _, im := range [][]float32{imp, nil} {
			t.Run(fmt.Sprintf("%s/importance=%v", s, im != nil), func(t *testing.T) {
				cpu := mustQuantize(t, w, n, k, s, Options{Imatrix: true, Importance: im})
				p, err := g.Params(w, n, k, s, im)
				if err != nil {
					t.Fatal(err)
				}
				for i := range p.Scales {
					if p.Scales[i] != cpu.Scales[i] || p.Zeros[i] != cpu.Zeros[i] {
						t.Fatalf("group %d (row %d): GPU scale %g zero %d, CPU %g %d", i, i/s.Groups(k), p.Scales[i], p.Zeros[i], cpu.Scales[i], cpu.Zeros[i])
					}
				}
				got := mustQuantize(t, w, n, k, s, Options{Params: p})
				if !slices.Equal(got.Codes, cpu.Codes) {
					t.Errorf("codes with the GPU's parameters differ from the CPU's")
				}
			})
		}
	}
}

func TestGPUWeightedRefusals(t *testing.T) {
	g := openGPUImatrix(t)
	w := randomWeights(4, 64, 1)
	if _, err := g.Params(w, 4, 64, quant.Scheme{Grid: quant.NF4, Bits: 4, GroupSize: 32, Sym: true}, nil); err == nil {
		t.Error("nf4 accepted")
	}
	w[70] = float32(math.Inf(1))
	if _, err := g.Params(w, 4, 64, quant.Scheme{Bits: 4, GroupSize: 32}, nil); err == nil || err.Error() != "weight at row 1, column 6 is +Inf" {
		t.Errorf("an infinite weight: %v", err)
	}
}

// BenchmarkGPUWeightedParams: the search of a 4096×11008 int4-g128 weight (7B MLP shape) with
// importance, on the GPU, against BenchmarkWeightedSearch's CPU rate on the same machine.
func BenchmarkGPUWeightedParams(b *testing.B) {
	g := openGPUImatrix(b)
	const n, k = 4096, 11008
	w := randomWeights(n, k, 3)
	imp := skewedImportance(k, 4)
	s := quant.Scheme{Bits: 4, GroupSize: 128}
	b.SetBytes(4 * n * k)
	for b.Loop() {
		if _, err := g.Params(w, n, k, s, imp); err != nil {
			b.Fatal(err)
		}
	}
}
