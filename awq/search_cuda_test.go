package awq

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

var gpuPTX = flag.String("awq.ptx", "", "load this PTX instead of the embedded kernels/awq.ptx")

// The embedded PTX was generated from the committed kernels/awq.cu, and the cubin assembled
// from it (a CPU test).
func TestPTXIsFresh(t *testing.T) {
	if err := cuda.CheckPTX(awqPTX, awqSource); err != nil {
		t.Fatal(err)
	}
	if err := cuda.CheckCubin(awqCubinSM90, awqPTX); err != nil {
		t.Fatalf("kernels/awq.sm_90.cubin: %v", err)
	}
}

func openSearch(t *testing.T) (*cuda.Device, *GPUSearch) {
	t.Helper()
	dev := gputest.Open(t)
	g, err := newGPUSearch(dev, gputest.PTX(t, awqPTX, *gpuPTX), gputest.Cubins(*gpuPTX, awqCubinSM90)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return dev, g
}

// searchSchemes have awkward shapes: a short last group, per-channel, symmetric and 2- to 8-bit.
var searchSchemes = []quant.Scheme{
	{Bits: 4, GroupSize: 64}, {Bits: 3, GroupSize: 128, Sym: true}, {Bits: 8, GroupSize: quant.PerChannel},
	{Bits: 2, GroupSize: 32}, {Bits: 4, GroupSize: 128},
}

// randomWeights draws n×k weights with heavy tails; every seventh row holds multiples of 1/8,
// whose quotients by F16 scales often land exactly on rounding ties.
func randomWeights(r *rand.Rand, n, k int) []float32 {
	w := make([]float32, n*k)
	for i := range w {
		if (i/k)%7 == 3 {
			w[i] = float32(r.IntN(33)-16) / 8
		} else {
			w[i] = float32(r.NormFloat64() * r.ExpFloat64())
		}
	}
	return w
}

// The kernel's candidate weights equal the CPU's bit for bit: the α search's Q(W·s)/s − W and
// the clipping search's W − Q(clamp(W)), with each group's absmax.
func TestGPUFakeQuantDiff(t *testing.T) {
	dev, g := openSearch(t)
	r := rand.New(rand.NewPCG(11, 12))
	const n, k = 37, 200
	for _, sc := range searchSchemes {
		w := randomWeights(r, n, k)
		s := make([]float32, k)
		for c := range s {
			s[c] = float32(math.Exp2(4*r.Float64() - 2))
		}
		l := Linear{Name: "l", W: w, Out: n, In: k, Scheme: &sc}
		wq, err := fakeQuantScaled(nil, l, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		gs := groupSize(sc, k)
		groups := (k + gs - 1) / gs
		wd, sd := gputest.Floats(t, dev, w), gputest.Floats(t, dev, s)
		d := gputest.Floats(t, dev, make([]float32, n*k))
		am := gputest.Floats(t, dev, make([]float32, n*groups))
		if err := g.fakeQuantDiff(wd, sd, d, 0, n, k, sc, 1); err != nil {
			t.Fatal(err)
		}
		got, err := download[float32](g, d, n*k)
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if want := wq[i] - w[i]; got[i] != want {
				t.Fatalf("%s α candidate: weight %d: GPU %g, CPU %g", sc, i, got[i], want)
			}
		}
		const shrink = 0.8
		wc := append([]float32(nil), w...)
		absmax := groupAbsMax(w, n, k, gs)
		clampGroups(wc, n, k, gs, absmax, shrink)
		if err := fakeQuant(wc, n, k, sc); err != nil {
			t.Fatal(err)
		}
		if err := g.fakeQuantDiff(wd, 0, d, am, n, k, sc, shrink); err != nil {
			t.Fatal(err)
		}
		if got, err = download[float32](g, d, n*k); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if want := w[i] - wc[i]; got[i] != want {
				t.Fatalf("%s clipping candidate: weight %d: GPU %g, CPU %g", sc, i, got[i], want)
			}
		}
		gotMax, err := download[float32](g, am, n*groups)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range gotMax {
			if v != absmax[i] {
				t.Fatalf("%s: group %d absmax %g, CPU %g", sc, i, v, absmax[i])
			}
		}
	}
}

// salientInputs draws rows×k activations in which every 37th channel is 30 times larger.
func salientInputs(r *rand.Rand, rows, k int) []float32 {
	x := make([]float32, rows*k)
	for i := range x {
		v := r.NormFloat64()
		if (i%k)%37 == 0 {
			v *= 30
		}
		x[i] = float32(v)
	}
	return x
}

// SearchScale on the GPU (true float32 GEMMs) measures every candidate's loss as the CPU does,
// within float32 rounding, and picks the same α; with TF32 and scaled FP16 within 1%.
func TestGPUSearchScale(t *testing.T) {
	dev, g := openSearch(t)
	r := rand.New(rand.NewPCG(13, 14))
	const rows, k = 300, 256
	x := salientInputs(r, rows, k)
	in := &Inputs{}
	if err := in.Add(x, rows, k); err != nil {
		t.Fatal(err)
	}
	xd := gputest.Floats(t, dev, x)
	s3, s4 := quant.Scheme{Bits: 3, GroupSize: 128}, quant.Scheme{Bits: 4, GroupSize: 64, Sym: true}
	ls := []Linear{
		{Name: "a", W: randomWeights(r, 96, k), Out: 96, In: k, Scheme: &s3},
		{Name: "b", W: randomWeights(r, 40, k), Out: 40, In: k}, // scaled with the group, not quantized
		{Name: "c", W: randomWeights(r, 72, k), Out: 72, In: k, Scheme: &s4},
	}
	for _, duo := range []bool{false, true} {
		opt := Options{Duo: duo}
		want, err := SearchScale(in.X, in.Rows, in.MeanAbs(), ls, opt)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []SearchMath{SearchF32, SearchTF32, SearchF16} {
			g.Math = m
			got, err := g.SearchScale(xd, rows, in.MeanAbs(), ls, opt)
			if err != nil {
				t.Fatal(err)
			}
			tol := 1e-2
			if m == SearchF32 {
				tol = 1e-4
			}
			for i, l := range want.Losses {
				if math.Abs(got.Losses[i]-l) > tol*l {
					t.Errorf("duo %v, math %d: α %.2f: loss %.6g on the GPU, %.6g on the CPU", duo, m, float64(i)/20, got.Losses[i], l)
				}
			}
			if got.Alpha != want.Alpha && !nearTie(want.Losses, 2*tol) {
				t.Errorf("duo %v, math %d: α %.2f on the GPU, %.2f on the CPU", duo, m, got.Alpha, want.Alpha)
			}
		}
	}
}

// nearTie reports whether the two smallest losses lie within rel of each other.
func nearTie(losses []float64, rel float64) bool {
	a, b := math.Inf(1), math.Inf(1)
	for _, l := range losses {
		if l < a {
			a, b = l, a
		} else if l < b {
			b = l
		}
	}
	return b-a <= rel*a
}

// SearchClip on the GPU finds the CPU's errors and clamps the same groups to the same ranges
// (only near-ties between shrinks may go either way).
func TestGPUSearchClip(t *testing.T) {
	dev, g := openSearch(t)
	r := rand.New(rand.NewPCG(15, 16))
	const rows, k, n = 1100, 200, 45 // 1100 rows: every 2nd of them, 512 tokens
	x := salientInputs(r, rows, k)
	xd := gputest.Floats(t, dev, x)
	for _, sc := range searchSchemes {
		w := randomWeights(r, n, k)
		cw, gw := append([]float32(nil), w...), append([]float32(nil), w...)
		want, err := SearchClip(x, rows, Linear{Name: "l", W: cw, Out: n, In: k, Scheme: &sc}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		got, err := g.SearchClip(xd, rows, Linear{Name: "l", W: gw, Out: n, In: k, Scheme: &sc}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(got.Err-want.Err) > 1e-4*want.Err || math.Abs(got.Err0-want.Err0) > 1e-4*want.Err0 {
			t.Errorf("%s: errors %.6g (unclipped %.6g) on the GPU, %.6g (%.6g) on the CPU", sc, got.Err, got.Err0, want.Err, want.Err0)
		}
		gs := groupSize(sc, k)
		groups, differ := (k+gs-1)/gs, 0
		for p := range n * groups {
			r, c0 := p/groups, (p%groups)*gs
			for c := c0; c < min(c0+gs, k); c++ {
				if cw[r*k+c] != gw[r*k+c] {
					differ++
					break
				}
			}
		}
		if differ > max(1, n*groups/50) || got.Clipped == 0 {
			t.Errorf("%s: %d of %d groups clamped differently from the CPU (%d clipped)", sc, differ, n*groups, got.Clipped)
		}
	}
}

// DeviceInputs keeps the rows and mean |x| that Inputs keeps from the same chunks, and names the
// channel of a NaN activation.
func TestGPUDeviceInputs(t *testing.T) {
	dev, g, e := openSearchAndEngine(t)
	r := rand.New(rand.NewPCG(17, 18))
	const cols, stride = 70, 3
	chunks := []int{10, 7, 1, 33}
	din, err := NewDeviceInputs(dev, cols, stride, 51)
	if err != nil {
		t.Fatal(err)
	}
	defer din.Free()
	in := &Inputs{Stride: stride}
	addChunks(t, r, e, g, din, in, chunks)
	if err := e.Synchronize(); err != nil {
		t.Fatal(err)
	}
	sameInputs(t, g, din, in)
	if err := din.Reset(0); err != nil {
		t.Fatal(err)
	}
	bad := make([]float32, 2*cols)
	bad[cols+41] = float32(math.NaN())
	if err := din.Add(e, g, gputest.Floats(t, dev, bad), 2); err != nil {
		t.Fatal(err)
	}
	e.Synchronize()
	if _, err := din.MeanAbs(); err == nil || !strings.Contains(err.Error(), "channel 41") {
		t.Errorf("NaN activation: %v", err)
	}
	if err := din.Add(e, g, gputest.Floats(t, dev, make([]float32, 60*cols)), 60); err == nil {
		t.Error("more rows than the inputs were sized for: no error")
	}
}

// Shards' inputs (consecutive token ranges, Reset at each share's first index, chunks of
// unequal sizes, one share without a kept row), joined, keep the rows and mean |x| that Inputs
// keeps of all the tokens, whether each chunk's sums and rows are added at once (Add) or, as
// an expert's routed tokens on several GPUs, every chunk's sums first (AddSums) and its rows in
// a second pass once the share's first index is known (Restart, Keep); a join into inputs too
// small for the rows is an error.
func TestGPUJoinedInputs(t *testing.T) {
	for _, twoPasses := range []bool{false, true} {
		t.Run(fmt.Sprintf("two passes %v", twoPasses), func(t *testing.T) { testJoinedInputs(t, twoPasses) })
	}
}

func testJoinedInputs(t *testing.T, twoPasses bool) {
	dev, g, e := openSearchAndEngine(t)
	r := rand.New(rand.NewPCG(19, 20))
	const cols, stride = 70, 4
	shards := [][]int{{10, 7}, {2}, {1, 33, 5}} // chunks of rows; tokens 0–16, 17–18, 19–57
	in := &Inputs{Stride: stride}
	var parts []*DeviceInputs
	start := 0
	for _, chunks := range shards {
		tokens := 0
		for _, rows := range chunks {
			tokens += rows
		}
		p, err := NewDeviceInputs(dev, cols, stride, tokens)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Free()
		if !twoPasses {
			err = p.Reset(start)
		} else if err = p.Reset(1 << 20); err == nil { // the first index is not known in the first pass
			addChunksTwice(t, r, e, g, p, in, chunks, start)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !twoPasses {
			addChunks(t, r, e, g, p, in, chunks)
		}
		parts = append(parts, p)
		start += tokens
	}
	if err := e.Synchronize(); err != nil {
		t.Fatal(err)
	}
	joined, err := NewDeviceInputs(dev, cols, stride, start)
	if err != nil {
		t.Fatal(err)
	}
	defer joined.Free()
	if err := g.Join(joined, parts); err != nil {
		t.Fatal(err)
	}
	if err := g.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if parts[1].Rows != 0 {
		t.Errorf("the second share kept %d rows, none of its tokens' indices a multiple of %d", parts[1].Rows, stride)
	}
	sameInputs(t, g, joined, in)
	small, err := NewDeviceInputs(dev, cols, stride, 20)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Free()
	if err := g.Join(small, parts); err == nil {
		t.Error("joined more rows than the inputs have room for: no error")
	}
}

// addChunksTwice adds random chunks to in, and to din in two passes: every chunk's sums, then
// (Restart at start) every chunk's rows; a Restart after a row was offered is an error.
func addChunksTwice(t *testing.T, r *rand.Rand, e *model.GPU, g *GPUSearch, din *DeviceInputs, in *Inputs, chunks []int, start int) {
	t.Helper()
	var xs []cuda.DevicePtr
	for _, rows := range chunks {
		xs = append(xs, randomChunk(t, r, e, in, rows, din.Cols))
		if err := din.AddSums(e, xs[len(xs)-1], rows); err != nil {
			t.Fatal(err)
		}
	}
	if err := din.Restart(start); err != nil {
		t.Fatal(err)
	}
	for i, rows := range chunks {
		if err := din.Keep(e, g, xs[i], rows); err != nil {
			t.Fatal(err)
		}
	}
	if err := din.Restart(start); err == nil {
		t.Error("restarted after rows were offered: no error")
	}
}

// sameInputs wants din (its GPU's work finished) to keep in's rows bit for bit and its mean |x|
// within float32 rounding.
func sameInputs(t *testing.T, g *GPUSearch, din *DeviceInputs, in *Inputs) {
	t.Helper()
	if din.Rows != in.Rows || din.Tokens() != in.Tokens() {
		t.Fatalf("kept %d rows of %d tokens, CPU %d of %d", din.Rows, din.Tokens(), in.Rows, in.Tokens())
	}
	got, err := download[float32](g, din.X, din.Rows*din.Cols)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != in.X[i] {
			t.Fatalf("kept value %d: %g, CPU %g", i, v, in.X[i])
		}
	}
	mean, err := din.MeanAbs()
	if err != nil {
		t.Fatal(err)
	}
	for c, m := range in.MeanAbs() {
		if math.Abs(float64(mean[c]-m)) > 1e-6*float64(m) {
			t.Errorf("channel %d: mean |x| %g, CPU %g", c, mean[c], m)
		}
	}
}

// openSearchAndEngine is openSearch with a model engine on the same GPU (closed when t ends), whose
// stream DeviceInputs.Add queues on.
func openSearchAndEngine(t *testing.T) (*cuda.Device, *GPUSearch, *model.GPU) {
	t.Helper()
	dev, g := openSearch(t)
	cfg, err := model.ParseConfig([]byte(familyConfigs[0].json))
	if err != nil {
		t.Fatal(err)
	}
	e, err := model.NewGPU(dev, cfg, model.GPUOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return dev, g, e
}

// randomChunk adds rows×cols random values to in and returns their copy on e's GPU.
func randomChunk(t *testing.T, r *rand.Rand, e *model.GPU, in *Inputs, rows, cols int) cuda.DevicePtr {
	t.Helper()
	x := make([]float32, rows*cols)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	if err := in.Add(x, rows, cols); err != nil {
		t.Fatal(err)
	}
	return gputest.Floats(t, e.Device(), x)
}

// addChunks adds chunks of random rows (counts in chunks) to din, on e's stream, and to in.
func addChunks(t *testing.T, r *rand.Rand, e *model.GPU, g *GPUSearch, din *DeviceInputs, in *Inputs, chunks []int) {
	t.Helper()
	for _, rows := range chunks {
		if err := din.Add(e, g, randomChunk(t, r, e, in, rows, din.Cols), rows); err != nil {
			t.Fatal(err)
		}
	}
}
