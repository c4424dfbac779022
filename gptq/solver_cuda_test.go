package gptq

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/quant"
)

// gpuPTX lets a GPU run try kernels compiled there before the embedded PTX is regenerated:
// go test -args -gptq.ptx=/path/gptq.ptx
var gpuPTX = flag.String("gptq.ptx", "", "load this PTX instead of the embedded kernels/gptq.ptx")

func TestGPUPTXIsFresh(t *testing.T) {
	if err := cuda.CheckPTX(gptqPTX, gptqSource); err != nil {
		t.Fatalf("kernels/gptq.ptx: %v", err)
	}
	if err := cuda.CheckCubin(gptqCubinSM90, gptqPTX); err != nil {
		t.Fatalf("kernels/gptq.sm_90.cubin: %v", err)
	}
}

// openGPUSolver opens GPU 0 and a solver that poisons its buffers, skipping without a GPU.
func openGPUSolver(tb testing.TB) (*cuda.Device, *GPUSolver) {
	tb.Helper()
	dev := gputest.Open(tb)
	return dev, newTestSolver(tb, dev)
}

// newTestSolver makes a solver on dev that poisons its buffers, closed when the test ends.
func newTestSolver(tb testing.TB, dev *cuda.Device) *GPUSolver {
	tb.Helper()
	g, err := newGPUSolver(dev, gputest.PTX(tb, gptqPTX, *gpuPTX), gputest.Cubins(*gpuPTX, gptqCubinSM90)...)
	if err != nil {
		tb.Fatal(err)
	}
	g.poison = true
	tb.Cleanup(func() { g.Close() })
	return g
}

// killColumns makes channels dead (H row and column zero), as inputs that were always zero.
func killColumns(h []float64, k int, cols ...int) {
	for _, c := range cols {
		for j := range k {
			h[c*k+j], h[j*k+c] = 0, 0
		}
	}
}

// compareWithCPU runs both paths and checks the acceptance: codes equal except near ties
// (< 0.1%), proxy losses within 1e-4 relative, same damping, same g_idx. It returns the
// number of differing codes.
func compareWithCPU(t *testing.T, g *GPUSolver, w []float32, n, k int, h []float64, s quant.Scheme, opt Options) int {
	t.Helper()
	diff, _ := compareWithCPUCounts(t, g, w, n, k, h, s, opt)
	return diff
}

// compareWithCPUCounts is compareWithCPU, also returning the number of groups whose scale or
// zero point differs.
func compareWithCPUCounts(t *testing.T, g *GPUSolver, w []float32, n, k int, h []float64, s quant.Scheme, opt Options) (codes, params int) {
	t.Helper()
	want, wst, err := Quantize(w, n, k, h, s, opt)
	if err != nil {
		t.Fatalf("CPU: %v", err)
	}
	got, gst, err := g.Quantize(w, n, k, h, s, opt)
	if err != nil {
		t.Fatalf("GPU: %v", err)
	}
	if got.N != n || got.K != k || got.Scheme != s {
		t.Fatalf("GPU tensor is %dx%d %s", got.N, got.K, got.Scheme)
	}
	diff := 0
	for i := range want.Codes {
		if got.Codes[i] != want.Codes[i] {
			diff++
		}
		if got.Codes[i] > uint8(s.MaxQ()) {
			t.Fatalf("code %d at %d is out of range (unwritten?)", got.Codes[i], i)
		}
	}
	paramDiff := 0
	for i := range want.Scales {
		if got.Scales[i] != want.Scales[i] || got.Zeros[i] != want.Zeros[i] {
			paramDiff++
		}
	}
	if limit := max(1, len(want.Codes)/1000); diff >= limit {
		t.Errorf("%d of %d codes differ from the CPU (limit %d)", diff, len(want.Codes), limit)
	}
	if paramDiff > max(1, len(want.Scales)/100) {
		t.Errorf("%d of %d group parameters differ from the CPU", paramDiff, len(want.Scales))
	}
	// A group parameter fitted across a tie moves its whole group's grid: the loss may then
	// differ more than the codes alone move it (seen: 1.2e-4 with 9 codes and one of 231
	// parameters differing, int3-g128 with the imatrix search).
	tol := 1e-4
	if paramDiff > 0 {
		tol = 1e-3
	}
	if d := relDiff(gst.Loss, wst.Loss); d > tol || gst.Loss != gst.Loss {
		t.Errorf("proxy loss %g, CPU %g (relative difference %.2g)", gst.Loss, wst.Loss, d)
	}
	// The reported loss is the one of the tensor returned.
	q := dequantizeAll(got)
	if direct := proxyLoss(w, q, n, k, h); relDiff(direct, gst.Loss) > 1e-3 {
		t.Errorf("GPU Stats.Loss %g, but tr(ΔW H ΔWᵀ) of its tensor is %g", gst.Loss, direct)
	}
	if gst.Damp != wst.Damp || gst.Retries != wst.Retries || gst.DeadColumns != wst.DeadColumns {
		t.Errorf("GPU damp %g retries %d dead %d, CPU %g %d %d", gst.Damp, gst.Retries, gst.DeadColumns, wst.Damp, wst.Retries, wst.DeadColumns)
	}
	if !slices.Equal(got.GIdx, want.GIdx) {
		t.Errorf("g_idx differs from the CPU")
	}
	return diff, paramDiff
}

func dequantizeAll(t *quant.Tensor) []float32 {
	q := make([]float32, t.N*t.K)
	groups := t.Scheme.Groups(t.K)
	for r := range t.N {
		for c := range t.K {
			i := r*groups + t.Group(c)
			q[r*t.K+c] = quant.DequantizeInt(t.Codes[r*t.K+c], t.Scales[i], t.Zeros[i])
		}
	}
	return q
}

func TestGPUMatchesCPU(t *testing.T) {
	_, g := openGPUSolver(t)
	r := rand.New(rand.NewPCG(11, 12))
	for _, shape := range [][2]int{{77, 300}, {64, 256}} {
		n, k := shape[0], shape[1]
		h := testHessian(t, r, k)
		killColumns(h, k, 7, k-2)
		for _, v := range variants() {
			t.Run(fmt.Sprintf("%dx%d/%s", n, k, v.name), func(t *testing.T) {
				w := randomWeights(r, n, k)
				if !g.Supports(v.s, v.opt) { // NF4: the CPU's; the GPU solver refuses it by name
					if _, _, err := g.Quantize(w, n, k, h, v.s, v.opt); err == nil || !strings.Contains(err.Error(), "integer grids, not "+v.s.String()) {
						t.Errorf("GPU solver on %s: %v", v.s, err)
					}
					return
				}
				compareWithCPU(t, g, w, n, k, h, v.s, v.opt)
			})
		}
	}
}

// TestGPULargerShapes: several blocks, groups of 64 and 256 across block edges, rows not a
// multiple of the kernel's 8 per block.
func TestGPULargerShapes(t *testing.T) {
	_, g := openGPUSolver(t)
	r := rand.New(rand.NewPCG(13, 14))
	for _, c := range []struct {
		n, k int
		s    quant.Scheme
		opt  Options
	}{
		{301, 1000, quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}, Options{}},
		{301, 1000, quant.Scheme{Bits: 4, GroupSize: 128}, Options{ActOrder: true}},
		{250, 640, quant.Scheme{Bits: 3, GroupSize: 64}, Options{ActOrder: true}},
		{250, 640, quant.Scheme{Bits: 4, GroupSize: 256, Sym: true}, Options{}},
		{250, 640, quant.Scheme{Bits: 2, GroupSize: 96}, Options{ActOrder: true, StaticGroups: true}},
		{130, 520, quant.Scheme{Bits: 8, GroupSize: quant.PerChannel}, Options{ActOrder: true}},
		{130, 520, quant.Scheme{Bits: 6, GroupSize: 128}, Options{}},
		{130, 520, quant.Scheme{Bits: 5, GroupSize: 32, Sym: true}, Options{ActOrder: true}},
		{301, 1000, quant.Scheme{Bits: 3, GroupSize: 128}, Options{Imatrix: true}},
		{250, 640, quant.Scheme{Bits: 3, GroupSize: 64}, Options{ActOrder: true, Imatrix: true}},
		{250, 640, quant.Scheme{Bits: 2, GroupSize: 96}, Options{ActOrder: true, StaticGroups: true, Imatrix: true}},
		{130, 520, quant.Scheme{Bits: 4, GroupSize: quant.PerChannel, Sym: true}, Options{Imatrix: true}},
		{250, 640, quant.Scheme{Bits: 4, GroupSize: 256}, Options{Clip: true}},
		{130, 520, quant.Scheme{Bits: 3, GroupSize: 32, Sym: true}, Options{ActOrder: true, Clip: true}},
	} {
		h := testHessian(t, r, c.k)
		w := randomWeights(r, c.n, c.k)
		t.Run(fmt.Sprintf("%dx%d/%s/act=%v/static=%v/weighted=%v/mse=%v", c.n, c.k, c.s, c.opt.ActOrder, c.opt.StaticGroups, c.opt.Imatrix, c.opt.Clip), func(t *testing.T) {
			diff := compareWithCPU(t, g, w, c.n, c.k, h, c.s, c.opt)
			t.Logf("%d of %d codes differ", diff, c.n*c.k)
		})
	}
}

// indefiniteHessian returns blocks [[1, c], [c, 1]] on the diagonal: eigenvalues 1 ± c.
func indefiniteHessian(k int, c float64) []float64 {
	h := make([]float64, k*k)
	for i := range k {
		h[i*k+i] = 1
		j := i ^ 1
		if j < k {
			h[i*k+j] = c
		}
	}
	return h
}

func TestGPUDampingRetries(t *testing.T) {
	_, g := openGPUSolver(t)
	r := rand.New(rand.NewPCG(15, 16))
	n, k := 40, 200
	h := indefiniteHessian(k, 1.05) // needs λ ≥ 0.05: damping 0.01 fails, 0.1 succeeds
	w := randomWeights(r, n, k)
	compareWithCPU(t, g, w, n, k, h, quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}, Options{})
	_, st, err := g.Quantize(w, n, k, h, quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}, Options{})
	if err != nil || st.Retries != 1 || st.Damp != 0.1 {
		t.Errorf("retries %d, damp %g, err %v; want 1 retry and damping 0.1", st.Retries, st.Damp, err)
	}
	_, _, err = g.Quantize(w, n, k, indefiniteHessian(k, 3), quant.Scheme{Bits: 4, GroupSize: 128}, Options{})
	if err == nil || !strings.Contains(err.Error(), "not positive definite") {
		t.Errorf("indefinite beyond MaxDamp: %v", err)
	}
}

func TestGPURefusesWhatItCannotDo(t *testing.T) {
	_, g := openGPUSolver(t)
	n, k := 8, 128
	w := make([]float32, n*k)
	h := indefiniteHessian(k, 0)
	s := quant.Scheme{Bits: 4, GroupSize: 128}
	if _, _, err := g.Quantize(w, n, k, h, s, Options{BlockSize: 64}); err == nil || !strings.Contains(err.Error(), "blocks of 128") {
		t.Errorf("block size 64: %v", err)
	}
	if g.Supports(s, Options{BlockSize: 64}) || g.Supports(quant.Scheme{Grid: quant.NF4, Bits: 4, GroupSize: 64, Sym: true}, Options{Imatrix: true}) {
		t.Errorf("Supports accepts blocks of 64 or NF4")
	}
	if !g.Supports(s, Options{Imatrix: true, ActOrder: true}) || !g.Supports(s, Options{Clip: true, StaticGroups: true}) {
		t.Errorf("Supports refuses the searched group fits")
	}
	if _, _, err := g.Quantize(w[:10], n, k, h, s, Options{}); err == nil {
		t.Errorf("short weights accepted")
	}
	w[5] = 1e30 // the scale of its group overflows F16
	for _, opt := range []Options{{}, {Imatrix: true}, {Imatrix: true, StaticGroups: true}} {
		if _, _, err := g.Quantize(w, n, k, h, s, opt); err == nil || !strings.Contains(err.Error(), "row 0, group 0: scale overflows") {
			t.Errorf("overflowing scale, %+v: %v", opt, err)
		}
	}
}

// TestGPUBaselineLoss: tr(W H Wᵀ) computed on the device equals quadraticForm's within TF32's
// rounding (its product's operands), dead columns included, on fresh random inputs of awkward
// sizes.
func TestGPUBaselineLoss(t *testing.T) {
	_, g := openGPUSolver(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 3))
	for _, sz := range [][2]int{{37, 300}, {200, 129}} {
		n, k := sz[0], sz[1]
		w, h := randomWeights(r, n, k), testHessian(t, r, k)
		killColumns(h, k, 5, k-1)
		opt := Options{BaselineLoss: true}
		_, st, err := g.Quantize(w, n, k, h, quant.Scheme{Bits: 4, GroupSize: 64}, opt)
		if err != nil {
			t.Fatal(err)
		}
		dead, _ := deadColumns(diagonal(h, k))
		if want := quadraticForm(w, n, k, h, dead); relDiff(st.Baseline, want) > 2e-3 {
			t.Errorf("%d×%d: baseline %.12g on the GPU, %.12g on the CPU", n, k, st.Baseline, want)
		}
	}
}

// TestGPUQuantizeGramMatchesHostHessian: given the calibration's float32 Gram matrix on the
// device, QuantizeGram (and QuantizeGramResident, with the weights on the device too) gives
// exactly what Quantize gives with H = scale·gram made on the host (dead channels and act-order
// included), on fresh random inputs; so does QuantizeGramRows for shares of the rows. The Gram
// path reads H from the Gram matrix as it builds the factor and H in float32 (hSource), the host
// path from slotH: the same doubles, so the same codes, losses and baseline bit for bit.
func TestGPUQuantizeGramMatchesHostHessian(t *testing.T) {
	dev, g := openGPUSolver(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 5))
	const n, k, rows = 45, 270, 600
	x := correlatedActivations(r, rows, k)
	for _, c := range []int{3, 200} { // dead input channels
		for row := range rows {
			x[row*k+c] = 0
		}
	}
	gram := make([]float32, k*k)
	for row := range rows {
		xr := x[row*k : (row+1)*k]
		for i, a := range xr {
			for j, b := range xr {
				gram[i*k+j] += a * b
			}
		}
	}
	scale := 2.0 / rows
	h := make([]float64, k*k)
	for i, v := range gram {
		h[i] = scale * float64(v)
	}
	p := gputest.Floats(t, dev, gram)
	w := randomWeights(r, n, k)
	resident := gputest.Floats(t, dev, w) // QuantizeGramResident's weights, as an engine holds them
	for _, opt := range []Options{{BaselineLoss: true}, {ActOrder: true}} {
		s := quant.Scheme{Bits: 4, GroupSize: 64}
		want, wst, err := g.Quantize(w, n, k, h, s, opt)
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{"QuantizeGram", "QuantizeGramResident"} {
			var got *quant.Tensor
			var gst Stats
			if path == "QuantizeGram" {
				got, gst, err = g.QuantizeGram(w, n, k, p, scale, s, opt)
			} else {
				got, gst, err = g.QuantizeGramResident(w, resident, n, k, p, scale, s, opt)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Codes, want.Codes) || !slices.Equal(got.Scales, want.Scales) || !slices.Equal(got.GIdx, want.GIdx) {
				t.Errorf("%+v: %s's tensor differs from Quantize's", opt, path)
			}
			if gst.Loss != wst.Loss || gst.Baseline != wst.Baseline || gst.DeadColumns != 2 || gst.Lambda != wst.Lambda {
				t.Errorf("%+v: %s's stats %+v, want %+v (2 dead columns)", opt, path, gst, wst)
			}
		}
		// QuantizeGramRows: two shares of the rows, the second first, into one tensor; each
		// equals Quantize of its rows (a GPU of a calibration on several solves such a share).
		dst := NewRowsTensor(s, n, k)
		ng := s.Groups(k)
		for _, rows := range [][2]int{{20, n}, {0, 20}} {
			lo, hi := rows[0], rows[1]
			for _, src := range []cuda.DevicePtr{0, resident.Add(4 * lo * k)} {
				part, _, err := g.QuantizeGramRows(dst, lo, w[lo*k:hi*k], src, hi-lo, k, p, scale, s, opt)
				if err != nil {
					t.Fatal(err)
				}
				want, _, err := g.Quantize(w[lo*k:hi*k], hi-lo, k, h, s, opt)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(dst.Codes[lo*k:hi*k], want.Codes) || !slices.Equal(dst.Scales[lo*ng:hi*ng], want.Scales) ||
					!slices.Equal(dst.Zeros[lo*ng:hi*ng], want.Zeros) || !slices.Equal(part.GIdx, want.GIdx) || !slices.Equal(part.Codes, want.Codes) {
					t.Errorf("%+v: QuantizeGramRows of rows %d..%d (weights on the device: %v) differs from Quantize's", opt, lo, hi, src != 0)
				}
				checkDequantizeTo(t, dev, g, part)
			}
		}
		if _, _, err := g.QuantizeGramRows(dst, 40, w[:10*k], resident, 10, k, p, scale, s, opt); err == nil {
			t.Errorf("rows 40..50 of a tensor of %d rows were accepted", n)
		}
	}
}

// checkDequantizeTo wants DequantizeTo after the solve of t to write t.Dequantize's values, bit
// for bit (a calibration engine's copy of the weights is replaced so).
func checkDequantizeTo(t *testing.T, dev *cuda.Device, g *GPUSolver, want *quant.Tensor) {
	t.Helper()
	dst, err := dev.Alloc(4 * want.N * want.K)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(dst)
	if err := g.DequantizeTo(dst); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, want.N*want.K)
	if err := dev.CopyFromDevice(cuda.Bytes(got), dst); err != nil {
		t.Fatal(err)
	}
	for i, v := range want.Dequantize(nil) {
		if math.Float32bits(got[i]) != math.Float32bits(v) {
			t.Fatalf("DequantizeTo: weight %d is %g, Dequantize gives %g", i, got[i], v)
		}
	}
}

// TestGPUQuantizeGramResidentRefusesNonFiniteWeights: a NaN or Inf in weights on the device
// (checked there, not on the host) is an error naming its row of the whole tensor and its column.
func TestGPUQuantizeGramResidentRefusesNonFiniteWeights(t *testing.T) {
	dev, g := openGPUSolver(t)
	const n, k = 16, 256
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 10))
	h := testHessian(t, r, k)
	gram := make([]float32, k*k)
	for i, v := range h {
		gram[i] = float32(v)
	}
	gd := gputest.Floats(t, dev, gram)
	w := randomWeights(r, n, k)
	s := quant.Scheme{Bits: 4, GroupSize: 128}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
		onDevice := slices.Clone(w)
		onDevice[9*k+37], onDevice[12*k+3] = bad, bad // the first one is reported
		src := gputest.Floats(t, dev, onDevice)
		_, _, err := g.QuantizeGramResident(w, src, n, k, gd, 1, s, Options{})
		if err == nil || !strings.Contains(err.Error(), "row 9, column 37 is not finite") {
			t.Errorf("%g in the resident weights: error %v", bad, err)
		}
		dst := NewRowsTensor(s, n+4, k)
		_, _, err = g.QuantizeGramRows(dst, 4, w, src, n, k, gd, 1, s, Options{})
		if err == nil || !strings.Contains(err.Error(), "row 13, column 37 is not finite") {
			t.Errorf("%g in the resident weights of rows 4..20: error %v", bad, err)
		}
		if _, _, err := g.QuantizeGramResident(w, src, n, k, gd, 1, s, Options{}); err == nil {
			t.Error("the second solve forgot the first's non-finite weight") // the flag is reset, the weights still bad
		}
	}
	// and a clean solve after them succeeds
	if _, _, err := g.QuantizeGramResident(w, gputest.Floats(t, dev, w), n, k, gd, 1, s, Options{}); err != nil {
		t.Errorf("clean weights after non-finite ones: %v", err)
	}
}

// TestGPUQuantizeGramRefusesNonFiniteActivations: a NaN or Inf that reached the Gram matrix
// (through its channel's diagonal) is an error naming the channel, not a garbage tensor.
func TestGPUQuantizeGramRefusesNonFiniteActivations(t *testing.T) {
	dev, g := openGPUSolver(t)
	const n, k = 16, 256
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	h := testHessian(t, r, k)
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1))} {
		gram := make([]float32, k*k)
		for i, v := range h {
			gram[i] = float32(v)
		}
		gram[77*k+77] = bad
		p, err := dev.Alloc(4 * k * k)
		if err != nil {
			t.Fatal(err)
		}
		if err := dev.CopyToDevice(p, cuda.Bytes(gram)); err != nil {
			t.Fatal(err)
		}
		_, _, err = g.QuantizeGram(randomWeights(r, n, k), n, k, p, 1, quant.Scheme{Bits: 4, GroupSize: 128}, Options{})
		dev.Free(p)
		if err == nil || !strings.Contains(err.Error(), "entry 77") || !strings.Contains(err.Error(), "non-finite") {
			t.Errorf("%v on the diagonal: error %v", bad, err)
		}
	}
}

// The GPU entry points take the zero Options as the defaults, and a diagonal of the wrong
// length is an error, not an index out of range (BenchmarkGPUQuantize once passed all of H).
func TestGPUZeroOptions(t *testing.T) {
	dev, g := openGPUSolver(t)
	const n, k = 64, 256
	w := randomWeights(rand.New(rand.NewPCG(4, 4)), n, k)
	h := kmsHessian(k)
	s := quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}
	compareWithCPU(t, g, w, n, k, h, s, Options{})
	if _, _, err := QuantizeGPU(dev, w, n, k, h, s, Options{}); err != nil {
		t.Errorf("QuantizeGPU with Options{}: %v", err)
	}
	if _, err := g.plan(n, k, h, s, Options{}); err == nil || !strings.Contains(err.Error(), "diagonal entries") {
		t.Errorf("plan with all of H as the diagonal: %v, want an error about its length", err)
	}
}

// A warmed solver solves as a fresh one does: the warm-up's synthetic problem leaves nothing
// behind that a later solve reads (the test solvers poison their buffers before every run, so a
// stale read shows as a difference). Two solvers warm with one's factor, as a conversion's sets do.
func TestGPUWarmLeavesSolvesUnchanged(t *testing.T) {
	dev, fresh := openGPUSolver(t)
	first, second := newTestSolver(t, dev), newTestSolver(t, dev)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 9))
	const n, k = 70, 384
	h := kmsHessian(k)
	w := randomWeights(r, n, k)
	for _, c := range []struct {
		s   quant.Scheme
		opt Options
	}{{quant.Scheme{Bits: 4, GroupSize: 128}, Options{BaselineLoss: true}}, {quant.Scheme{Bits: 3, GroupSize: 64, Sym: true}, Options{ActOrder: true}}} {
		f, err := first.WarmFactor(2*k, c.opt) // larger than the solve: buffers it only partly uses
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range []*GPUSolver{first, second} {
			if err := g.Warm(2*n, f, c.s, c.opt); err != nil {
				t.Fatal(err)
			}
		}
		want, wst, err := fresh.Quantize(w, n, k, h, c.s, c.opt)
		if err != nil {
			t.Fatal(err)
		}
		for i, g := range []*GPUSolver{first, second} {
			got, gst, err := g.Quantize(w, n, k, h, c.s, c.opt)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Codes, want.Codes) || !slices.Equal(got.Scales, want.Scales) || !slices.Equal(got.Zeros, want.Zeros) ||
				!slices.Equal(got.GIdx, want.GIdx) || gst.Loss != wst.Loss || gst.Baseline != wst.Baseline {
				t.Errorf("%v %+v: warmed solver %d's result differs from a fresh one's", c.s, c.opt, i)
			}
		}
	}
	f, err := first.WarmFactor(256, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := first.Quantize(w, n, k, h, quant.Scheme{Bits: 4, GroupSize: 128}, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := second.Warm(8, f, quant.Scheme{Bits: 4, GroupSize: 64}, Options{}); err == nil {
		t.Error("Warm with a factor its maker has replaced: no error")
	}
}

// TestGPUResultsLater: SolveFactored's results brought down after DequantizeTo, while another
// solve on the same solver waits for them (started before they are asked for), equal a fresh
// solver's Quantize for both solves, and DequantizeTo's weights equal the tensor's dequantized.
func TestGPUResultsLater(t *testing.T) {
	dev, fresh := openGPUSolver(t)
	g := newTestSolver(t, dev)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 10))
	const n, k = 70, 384
	h := kmsHessian(k)
	w1, w2 := randomWeights(r, n, k), randomWeights(r, n, k)
	s, opt := quant.Scheme{Bits: 4, GroupSize: 128}, Options{BaselineLoss: true, ActOrder: true}
	if err := g.upload(slotH, cuda.Bytes(h)); err != nil {
		t.Fatal(err)
	}
	fs, err := factorAll([]*GPUSolver{g}, diagonal(h, k), k, opt, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dst, err := dev.Alloc(4 * n * k)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(dst)
	first, err := g.SolveFactored(nil, 0, w1, 0, n, fs[0], s, opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.DequantizeTo(dst); err != nil {
		t.Fatal(err)
	}
	type result struct {
		t   *quant.Tensor
		st  Stats
		err error
	}
	second := make(chan result, 1)
	go func() { // waits in SolveFactored for first's results
		sv, err := g.SolveFactored(nil, 0, w2, 0, n, fs[0], s, opt)
		if err != nil {
			second <- result{err: err}
			return
		}
		tt, st, err := sv.Results()
		second <- result{tt, st, err}
	}()
	time.Sleep(20 * time.Millisecond)
	got1, st1, err := first.Results()
	if err != nil {
		t.Fatal(err)
	}
	if want := got1.Dequantize(nil); !slices.Equal(download(t, dev, dst, n*k), want) {
		t.Error("DequantizeTo before the results came down: weights differ from the tensor's")
	}
	got2 := <-second
	if got2.err != nil {
		t.Fatal(got2.err)
	}
	for i, c := range []struct {
		w   []float32
		got *quant.Tensor
		st  Stats
	}{{w1, got1, st1}, {w2, got2.t, got2.st}} {
		want, wst, err := fresh.Quantize(c.w, n, k, h, s, opt)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(c.got.Codes, want.Codes) || !slices.Equal(c.got.Scales, want.Scales) || !slices.Equal(c.got.Zeros, want.Zeros) ||
			!slices.Equal(c.got.GIdx, want.GIdx) || c.st.Loss != wst.Loss || c.st.Baseline != wst.Baseline || c.st.RelativeLoss != wst.RelativeLoss {
			t.Errorf("solve %d: results brought down later differ from a fresh solver's", i+1)
		}
	}
}
