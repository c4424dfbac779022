package iquant

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/quant"
)

// gpuPTX lets a GPU run try kernels/iquant.cu compiled there before the embedded PTX is
// regenerated: go test -args -iquant.ptx=/path/iquant.ptx
var gpuPTX = flag.String("iquant.ptx", "", "load this PTX instead of the embedded kernels/iquant.ptx")

func TestGPUPTXIsFresh(t *testing.T) {
	if err := cuda.CheckPTX(iquantPTX, iquantSource); err != nil {
		t.Fatalf("kernels/iquant.ptx: %v", err)
	}
}

// openGPUFitter opens GPU 0 and a fitter, skipping without a GPU.
func openGPUFitter(tb testing.TB) *GPUFitter {
	tb.Helper()
	dev := gputest.Open(tb)
	g, err := newGPUFitter(dev, gputest.PTX(tb, iquantPTX, *gpuPTX))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	return g
}

// quantizeFunc is GPUFitter.Quantize or a stand-in for it.
type quantizeFunc func(w []float32, n, k int, s quant.Scheme, imp []float32) (*quant.Tensor, error)

// TestGPUFitMatchesCPU: on the fixture rows (every kind, K = 1024) and on fresh random rows
// (K = 512), with every fixture importance (none, random, scattered zeros, a sub-block of zeros,
// a wide range), the GPU's tensor equals Quantize's byte for byte for every type, or both
// refuse it with the same error.
func TestGPUFitMatchesCPU(t *testing.T) {
	checkFits(t, openGPUFitter(t).Quantize)
}

// checkFits compares quantize with the CPU on TestGPUFitMatchesCPU's tensors.
func checkFits(t *testing.T, quantize quantizeFunc) {
	r := rand.New(rand.NewPCG(51, 52))
	var fixture []float32
	for row := range fixtureRows {
		fixture = append(fixture, fixtureRow(row)...)
	}
	random := randomWeights(r, 7*512)
	for _, typ := range allTypes(t) {
		for v := range fixtureVariants {
			for _, c := range []struct {
				w    []float32
				k    int
				name string
			}{{fixture, fixtureK, "fixture"}, {random, 512, "random"}} {
				imp := fixtureImportance(v)
				if imp != nil {
					imp = imp[:c.k]
				}
				t.Run(fmt.Sprintf("%s/%s/imp%d", typ.Scheme, c.name, v), func(t *testing.T) {
					n := len(c.w) / c.k
					want, cerr := Quantize(c.w, n, c.k, typ.Scheme, imp)
					got, gerr := quantize(c.w, n, c.k, typ.Scheme, imp)
					switch {
					case cerr != nil || gerr != nil:
						if fmt.Sprint(cerr) != fmt.Sprint(gerr) {
							t.Fatalf("the CPU says %v, the GPU %v", cerr, gerr)
						}
					case !reflect.DeepEqual(got, want):
						t.Fatal(firstDifference(got, want))
					}
				})
			}
		}
	}
}

// firstDifference names the first field where two IQ tensors differ.
func firstDifference(got, want *quant.Tensor) string {
	for i := range want.Scales {
		if math.Float32bits(got.Scales[i]) != math.Float32bits(want.Scales[i]) {
			return fmt.Sprintf("d of block %d: %g, want %g", i, got.Scales[i], want.Scales[i])
		}
	}
	for name, v := range map[string][2]any{"sub-block scale": {got.SubScales, want.SubScales}, "grid point": {got.Points, want.Points},
		"sign byte": {got.Signs, want.Signs}, "code": {got.Codes, want.Codes}} {
		g, w := reflect.ValueOf(v[0]), reflect.ValueOf(v[1])
		for i := range w.Len() {
			if g.Index(i).Interface() != w.Index(i).Interface() {
				return fmt.Sprintf("%s %d: %v, want %v", name, i, g.Index(i), w.Index(i))
			}
		}
	}
	return "the tensors differ"
}

// TestGPUFitRefusals: what the CPU refuses, the GPU refuses with the same words.
func TestGPUFitRefusals(t *testing.T) {
	checkRefusals(t, openGPUFitter(t).Quantize)
}

// checkRefusals gives quantize and the CPU's Quantize bad inputs: both must fail alike.
func checkRefusals(t *testing.T, quantize quantizeFunc) {
	s := func(it quant.IQType) quant.Scheme { s, _ := quant.IQuantScheme(it); return s }
	const n, k = 3, 512
	r := rand.New(rand.NewPCG(53, 54))
	w := randomWeights(r, n*k)
	nan := append([]float32{}, w...)
	nan[2*k+300] = float32(math.NaN())
	huge := append([]float32{}, w...)
	huge[k+40] = 1e30
	neg := randomImportance(r, k)
	neg[7] = -1
	for _, c := range []struct {
		what string
		s    quant.Scheme
		w    []float32
		k    int
		imp  []float32
	}{
		{"NaN weight", s(quant.IQ3S), nan, k, nil},
		{"no importance", s(quant.IQ2XXS), w, k, nil},
		{"negative importance", s(quant.IQ2S), w, k, neg},
		{"huge weight", s(quant.IQ4NL), huge, k, nil},
		{"partial block", s(quant.IQ3XXS), w, 384, nil},
	} {
		_, cerr := Quantize(c.w, len(c.w)/c.k, c.k, c.s, c.imp)
		_, gerr := quantize(c.w, len(c.w)/c.k, c.k, c.s, c.imp)
		if cerr == nil || fmt.Sprint(cerr) != fmt.Sprint(gerr) {
			t.Errorf("%s: the CPU says %v, the GPU %v", c.what, cerr, gerr)
		}
	}
	if !strings.Contains(fmt.Sprint(quantize(w, n, k, s(quant.IQ2XXS), nil)), "needs an importance matrix") {
		t.Error("iq2_xxs without importance was not refused")
	}
}

// BenchmarkGPUFit fits a 4096×11008 iq2_xs and iq4_xs weight with importance on the GPU: MB/s
// of float32 input (uploads and downloads included), against Quantize on all cores in the same
// run (cpu-MB/s, one pass) and x-cpu.
func BenchmarkGPUFit(b *testing.B) {
	g := openGPUFitter(b)
	const n, k = 4096, 11008
	r := rand.New(rand.NewPCG(55, 56))
	w, imp := randomWeights(r, n*k), randomImportance(r, k)
	for _, it := range []quant.IQType{quant.IQ2XS, quant.IQ4XS} {
		s, _ := quant.IQuantScheme(it)
		b.Run(s.String(), func(b *testing.B) {
			start := time.Now()
			if _, err := Quantize(w, n, k, s, imp); err != nil {
				b.Fatal(err)
			}
			cpu := float64(4*n*k) / 1e6 / time.Since(start).Seconds()
			b.SetBytes(4 * n * k)
			for b.Loop() {
				if _, err := g.Quantize(w, n, k, s, imp); err != nil {
					b.Fatal(err)
				}
			}
			gpu := float64(4*n*k) * float64(b.N) / 1e6 / b.Elapsed().Seconds()
			b.ReportMetric(cpu, "cpu-MB/s")
			b.ReportMetric(gpu/cpu, "x-cpu")
		})
	}
}
