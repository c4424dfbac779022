package kquant

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/quant"
)

// gpuPTX lets a GPU run try kernels/kquant.cu compiled there before the embedded PTX is
// regenerated: go test -args -kquant.ptx=/path/kquant.ptx
var gpuPTX = flag.String("kquant.ptx", "", "load this PTX instead of the embedded kernels/kquant.ptx")

func TestGPUPTXIsFresh(t *testing.T) {
	if err := cuda.CheckPTX(kquantPTX, kquantSource); err != nil {
		t.Fatalf("kernels/kquant.ptx: %v", err)
	}
	if err := cuda.CheckCubin(kquantCubinSM90, kquantPTX); err != nil {
		t.Fatalf("kernels/kquant.sm_90.cubin: %v", err)
	}
}

// openGPUFitter opens GPU 0 and a fitter that poisons its outputs, skipping without a GPU: the
// embedded cubin where it fits the GPU, as in a conversion, else the PTX (-kquant.ptx's when set).
func openGPUFitter(tb testing.TB) *GPUFitter {
	tb.Helper()
	dev := gputest.Open(tb)
	var cubins [][]byte
	if *gpuPTX == "" {
		cubins = [][]byte{kquantCubinSM90}
	}
	g, err := newGPUFitter(dev, DefaultGPUSlots, gputest.PTX(tb, kquantPTX, *gpuPTX), cubins...)
	if err != nil {
		tb.Fatal(err)
	}
	g.poison = true
	tb.Cleanup(func() { g.Close() })
	return g
}

// fitTestRows draws perKind rows of k weights of every kind randomRow draws (normal,
// heavy-tailed, one-signed, large negative, sparse, tiny, constant, zero) and of kinds that
// take rarer paths: weights around F32's smallest subnormals (inverse scales overflow to Inf,
// Inf·0 = NaN on the way), BF16-rounded weights (ties), normal weights with an all-zero
// sub-block and a −0, and a few large weights among small ones.
func fitTestRows(r *rand.Rand, k, perKind int) [][]float32 {
	var rows [][]float32
	for kind := range 12 {
		for range perKind {
			var w []float32
			switch kind {
			case 8:
				w = make([]float32, k)
				for i := range w {
					w[i] = float32(1e-40 * r.NormFloat64())
				}
			case 9:
				w = randomRow(r, 0, k)
				for i, v := range w {
					w[i] = fp.BF16ToF32(fp.F32ToBF16(v))
				}
			case 10:
				w = randomRow(r, 0, k)
				clear(w[k/3 : 2*k/3])
				w[k-1] = float32(math.Copysign(0, -1))
			case 11:
				w = randomRow(r, 0, k)
				for range 4 {
					w[r.IntN(k)] = float32(30 * r.NormFloat64())
				}
			default:
				w = randomRow(r, kind, k)
			}
			rows = append(rows, w)
		}
	}
	return rows
}

// fitTestImportances are the importances the GPU tests fit with: none; log-normal with zeros;
// all zero; log-normal with one channel in 16 huge (sums overflow to Inf and give NaNs; some
// super-blocks then get a non-finite d, which both refuse); tiny (products underflow).
func fitTestImportances(r *rand.Rand, k int) [][]float32 {
	imp, huge, tiny := randomImportance(r, k), randomImportance(r, k), randomImportance(r, k)
	for i := range imp {
		if r.IntN(8) == 0 {
			imp[i] = 0
		}
		if r.IntN(16) == 0 {
			huge[i] *= 1e30
		}
		tiny[i] *= 1e-38
	}
	return [][]float32{nil, imp, make([]float32, k), huge, tiny}
}

// cpuTensor fits the rows on the CPU with QuantizeRow, rows spread over the cores.
func cpuTensor(kt *Type, rows [][]float32, imp []float32) (*quant.Tensor, error) {
	q := quant.NewKQuantTensor(kt.Scheme, len(rows), len(rows[0]))
	errs := make([]error, len(rows))
	var wg sync.WaitGroup
	workers := runtime.GOMAXPROCS(0)
	for wk := range workers {
		wg.Go(func() {
			for n := wk; n < len(rows); n += workers {
				errs[n] = kt.QuantizeRow(q, n, rows[n], imp)
			}
		})
	}
	wg.Wait()
	for n, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("row %d, %w", n, err)
		}
	}
	return q, nil
}

// sameTensor compares two k-quant tensors byte for byte (float parameters by their bits).
func sameTensor(got, want *quant.Tensor) error {
	for i := range want.Codes {
		if got.Codes[i] != want.Codes[i] {
			return fmt.Errorf("code at row %d, column %d: %d, want %d", i/want.K, i%want.K, got.Codes[i], want.Codes[i])
		}
	}
	blocks := want.Scheme.SuperBlocks(want.K)
	for name, v := range map[string][2][]float32{"d": {got.Scales, want.Scales}, "dmin": {got.Mins, want.Mins}} {
		for i := range v[1] {
			if math.Float32bits(v[0][i]) != math.Float32bits(v[1][i]) {
				return fmt.Errorf("%s of row %d, super-block %d: %g, want %g", name, i/blocks, i%blocks, v[0][i], v[1][i])
			}
		}
	}
	subs := want.K / want.Scheme.GroupSize
	for i := range want.SubScales {
		if got.SubScales[i] != want.SubScales[i] {
			return fmt.Errorf("scale of row %d, sub-block %d: %d, want %d", i/subs, i%subs, got.SubScales[i], want.SubScales[i])
		}
	}
	for i := range want.SubMins {
		if got.SubMins[i] != want.SubMins[i] {
			return fmt.Errorf("min of row %d, sub-block %d: %d, want %d", i/subs, i%subs, got.SubMins[i], want.SubMins[i])
		}
	}
	return nil
}

func flatten(rows [][]float32) []float32 { return slices.Concat(rows...) }

// compareWithCPU fits the rows with quantize (a GPU fit) and on the CPU: the tensors must be
// the same, or both refused with the same error.
func compareWithCPU(kt *Type, rows [][]float32, imp []float32, quantize quantizeFunc) error {
	want, cerr := cpuTensor(kt, rows, imp)
	got, gerr := quantize(flatten(rows), len(rows), len(rows[0]), kt.Scheme, imp)
	switch {
	case cerr != nil || gerr != nil:
		if fmt.Sprint(cerr) != fmt.Sprint(gerr) {
			return fmt.Errorf("the CPU says %v, the GPU %v", cerr, gerr)
		}
		return nil
	}
	return sameTensor(got, want)
}

// TestGPUFitMatchesCPU: on fresh random rows of every kind (fitTestRows), rows of whole
// super-blocks (256, 1024) and with a short last one (384, 1120; and 48 or 96 alone), with
// every importance of fitTestImportances, the GPU's tensor equals QuantizeRow's byte for byte
// for every type: codes, d, dmin, sub-block scales and mins (or both refuse it alike).
func TestGPUFitMatchesCPU(t *testing.T) {
	checkFits(t, openGPUFitter(t).Quantize)
}

// quantizeFunc is GPUFitter.Quantize or a stand-in for it.
type quantizeFunc func(w []float32, n, k int, s quant.Scheme, imp []float32) (*quant.Tensor, error)

// checkFits compares quantize with the CPU on the shapes, rows and importances of
// TestGPUFitMatchesCPU.
func checkFits(t *testing.T, quantize quantizeFunc) {
	r := rand.New(rand.NewPCG(31, 32))
	for _, kt := range allTypes(t) {
		for _, k := range []int{256, 384, 1024, 1120, 3 * kt.Sub} {
			rows := fitTestRows(r, k, 3)
			for i, imp := range fitTestImportances(r, k) {
				t.Run(fmt.Sprintf("%s/k=%d/importance=%d", kt.Scheme, k, i), func(t *testing.T) {
					if err := compareWithCPU(kt, rows, imp, quantize); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

// TestGPUFitRefusals: what the CPU refuses, the GPU refuses with the same words, naming the
// row and column: non-finite weights, bad importance, weights beyond F16's range, schemes and
// shapes that are not k-quant ones.
func TestGPUFitRefusals(t *testing.T) {
	checkRefusals(t, openGPUFitter(t).Quantize)
}

// checkRefusals gives quantize what TestGPUFitRefusals lists.
func checkRefusals(t *testing.T, quantize quantizeFunc) {
	q4, _ := quant.KQuantScheme(4)
	const n, k = 3, 320
	w := make([]float32, n*k)
	check := func(what string, w, imp []float32, s quant.Scheme, k int, want string) {
		t.Helper()
		if _, err := quantize(w, len(w)/k, k, s, imp); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error containing %q", what, err, want)
		}
	}
	w[2*k+300] = float32(math.NaN())
	check("NaN weight", w, nil, q4, k, "weight at row 2, column 300 is NaN")
	w[2*k+300] = 0
	imp := make([]float32, k)
	imp[7] = -1
	check("negative importance", w, imp, q4, k, "importance of input channel 7 is -1")
	imp[7] = float32(math.Inf(1))
	check("infinite importance", w, imp, q4, k, "importance of input channel 7 is +Inf")
	w[k+260] = 3e38
	check("weights beyond F16", w, nil, q4, k, "row 1, columns 256…319: super-block scale d = +Inf")
	check("int4", w, nil, quant.Scheme{Bits: 4, GroupSize: 32}, k, "not a k-quant scheme")
	check("K = 48 in q4_k", make([]float32, 96), nil, q4, 48, "whole sub-blocks of 32")
}

// BenchmarkGPUFit: a 4096×11008 q4_k fit with importance (a 7B MLP weight under --imatrix) on
// the GPU, uploads and downloads included, in MB/s of float32 input; cpu-MB/s is QuantizeRow
// over the same tensor on all cores, measured once in the same run, and x-cpu the ratio;
// kernel-MB/s is the fit kernel's alone (CUDA events), h2d-GB/s and d2h-GB/s the copies'.
func BenchmarkGPUFit(b *testing.B) {
	g := openGPUFitter(b)
	g.poison = false
	const n, k = 4096, 11008
	r := rand.New(rand.NewPCG(41, 42))
	rows := make([][]float32, n)
	for i := range rows {
		rows[i] = randomRow(r, i%2, k) // normal and heavy-tailed
	}
	w, imp := flatten(rows), randomImportance(r, k)
	q4, _ := quant.KQuantScheme(4)
	kt, _ := TypeOf(q4)
	start := time.Now()
	want, err := cpuTensor(kt, rows, imp)
	if err != nil {
		b.Fatal(err)
	}
	cpuRate := 4 * n * k / time.Since(start).Seconds() / 1e6
	var got *quant.Tensor
	b.SetBytes(4 * n * k)
	for b.Loop() {
		if got, err = g.Quantize(w, n, k, q4, imp); err != nil {
			b.Fatal(err)
		}
	}
	rate := float64(4*n*k) * float64(b.N) / b.Elapsed().Seconds() / 1e6
	b.ReportMetric(cpuRate, "cpu-MB/s")
	b.ReportMetric(rate/cpuRate, "x-cpu")
	reportStats(b, g.Stats())
	if err := sameTensor(got, want); err != nil {
		b.Errorf("the GPU's tensor differs from the CPU's: %v", err)
	}
}

// storedAs returns rows as a checkpoint stores them in dtype (little-endian bytes) and the
// float32 values those bytes hold, which the CPU fits.
func storedAs(rows [][]float32, dtype cuda.DType) (raw []byte, values [][]float32) {
	for _, row := range rows {
		v := make([]float32, len(row))
		for i, x := range row {
			switch dtype {
			case cuda.BF16:
				h := fp.F32ToBF16(x)
				raw, v[i] = append(raw, byte(h), byte(h>>8)), fp.BF16ToF32(h)
			case cuda.F16:
				h := fp.F32ToF16(x)
				raw, v[i] = append(raw, byte(h), byte(h>>8)), fp.F16ToF32(h)
			default:
				raw, v[i] = append(raw, cuda.Bytes([]float32{x})...), x
			}
		}
		values = append(values, v)
	}
	return raw, values
}

// TestGPUFitBlocksMatchesCPU: FitBlocks and QuantizeRaw from weights stored as BF16, F16 and
// F32, on fresh random rows of every kind with every importance of fitTestImportances, give
// QuantizeRow's tensor and its bytes encoded by AppendRow for every type (or all refuse it
// alike, words and all: a BF16 or F16 weight that is ±Inf or NaN, d beyond F16).
func TestGPUFitBlocksMatchesCPU(t *testing.T) {
	g := openGPUFitter(t)
	r := rand.New(rand.NewPCG(33, 34))
	for _, kt := range allTypes(t) {
		for _, k := range []int{256, 1024} {
			rows := fitTestRows(r, k, 2)
			for _, dtype := range []cuda.DType{cuda.BF16, cuda.F16, cuda.F32} {
				raw, values := storedAs(rows, dtype)
				for i, imp := range fitTestImportances(r, k) {
					t.Run(fmt.Sprintf("%s/k=%d/%s/importance=%d", kt.Scheme, k, dtype, i), func(t *testing.T) {
						fill := func(dst []byte) error { copy(dst, raw); return nil }
						wantT, cerr := cpuTensor(kt, values, imp)
						var got []byte
						gerr := g.FitBlocks(fill, dtype, len(rows), k, kt.Scheme, imp, func(b []byte) error { got = slices.Clone(b); return nil })
						gotT, terr := g.QuantizeRaw(fill, dtype, len(rows), k, kt.Scheme, imp)
						switch {
						case cerr != nil || gerr != nil || terr != nil:
							if fmt.Sprint(cerr) != fmt.Sprint(gerr) || fmt.Sprint(cerr) != fmt.Sprint(terr) {
								t.Fatalf("the CPU says %v, FitBlocks %v, QuantizeRaw %v", cerr, gerr, terr)
							}
						case !slices.Equal(got, encodeRows(kt, wantT)):
							want := encodeRows(kt, wantT)
							t.Fatalf("the GPU's %d bytes differ from the CPU's %d (first at %d)", len(got), len(want), firstDiff(got, want))
						default:
							if err := sameTensor(gotT, wantT); err != nil {
								t.Fatalf("QuantizeRaw: %v", err)
							}
						}
					})
				}
			}
		}
	}
}

// TestGPUFitBlocksRefusals: a non-finite BF16 weight is named by row and column; shapes that
// are not whole ggml blocks and other dtypes are refused before anything runs.
func TestGPUFitBlocksRefusals(t *testing.T) {
	g := openGPUFitter(t)
	q4, _ := quant.KQuantScheme(4)
	const n, k = 3, 512
	raw := make([]byte, 2*n*k)
	raw[2*(2*k+300)+1] = 0x7f // BF16 0x7f80: +Inf
	raw[2*(2*k+300)] = 0x80
	fill := func(dst []byte) error { copy(dst, raw); return nil }
	use := func([]byte) error { return nil }
	for _, c := range []struct {
		what  string
		err   error
		wants string
	}{
		{"+Inf weight", g.FitBlocks(fill, cuda.BF16, n, k, q4, nil, use), "weight at row 2, column 300 is +Inf"},
		{"K = 320", g.FitBlocks(fill, cuda.BF16, n, 320, q4, nil, use), "multiple of 256"},
		{"short importance", g.FitBlocks(fill, cuda.BF16, n, k, q4, make([]float32, 3), use), "3 importance weights for 512"},
		{"F64", g.FitBlocks(fill, cuda.DType(7), n, k, q4, nil, use), "BF16, F16 or F32"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.wants) {
			t.Errorf("%s: %v, want an error containing %q", c.what, c.err, c.wants)
		}
	}
}

// BenchmarkGPUFitBlocks: a 4096×11008 weight stored as BF16 (a 7B MLP weight) to ggml's q4_k
// and q6_k blocks without importance (llama-quantize's Q4_K_M), from host memory to host
// memory, in MB/s of BF16 input, with 1 caller and with as many callers as slots (a conversion's
// overlap of upload, fit and download). kernel-MB/s is the input over the widening, fit and
// pack kernels' device time (CUDA events), h2d-GB/s and d2h-GB/s the copies'.
func BenchmarkGPUFitBlocks(b *testing.B) {
	const n, k = 4096, 11008
	r := rand.New(rand.NewPCG(43, 44))
	rows := make([][]float32, n)
	for i := range rows {
		rows[i] = randomRow(r, i%2, k)
	}
	raw, _ := storedAs(rows, cuda.BF16)
	fill := func(dst []byte) error { copy(dst, raw); return nil }
	use := func([]byte) error { return nil }
	for _, bits := range []int{4, 6} {
		s, _ := quant.KQuantScheme(bits)
		for _, callers := range []int{1, DefaultGPUSlots} {
			b.Run(fmt.Sprintf("%s/callers=%d", s, callers), func(b *testing.B) {
				g := openGPUFitter(b)
				g.poison = false
				b.SetBytes(int64(len(raw)))
				runCallers(b, callers, func() error { return g.FitBlocks(fill, cuda.BF16, n, k, s, nil, use) })
				reportStats(b, g.Stats())
			})
		}
	}
}

// runCallers runs call b.N times from callers goroutines at once, after one untimed call from
// each (which grows the slots' buffers).
func runCallers(b *testing.B, callers int, call func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			if err := call(); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	b.ResetTimer()
	for range callers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := call(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// reportStats reports the device phases of a fitter's calls: kernel-MB/s (input bytes over the
// kernels' time), h2d-GB/s and d2h-GB/s.
func reportStats(b *testing.B, st cuda.SlotStats) {
	if st.Kernels > 0 {
		b.ReportMetric(float64(st.InBytes)/st.Kernels.Seconds()/1e6, "kernel-MB/s")
	}
	if st.Upload > 0 {
		b.ReportMetric(float64(st.InBytes)/st.Upload.Seconds()/1e9, "h2d-GB/s")
	}
	if st.Download > 0 {
		b.ReportMetric(float64(st.OutBytes)/st.Download.Seconds()/1e9, "d2h-GB/s")
	}
}
