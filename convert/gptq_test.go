package convert

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/gptq"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
)

func gptqOptions(t *testing.T, s quant.Scheme) Options {
	opt := DefaultOptions()
	opt.Method = "gptq"
	opt.Alloc = Uniform(s)
	opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 4, SeqLen: 128}
	return opt
}

var q3k, _ = quant.KQuantScheme(3)

// GPTQ through the whole pipeline, on the integer grid, NF4 and a k-quant: every linear is quantized,
// the provenance records the calibration, and the weights differ from RTN's.
func TestGPTQConvert(t *testing.T) {
	for _, c := range []struct {
		s      quant.Scheme
		format string
	}{
		{quant.Scheme{Bits: 3, GroupSize: 128}, "gptq"},
		{quant.Scheme{Grid: quant.NF4, Bits: 4, GroupSize: 64, Sym: true}, "qpack"},
		{q3k, "qpack"},
	} {
		t.Run(c.s.String(), func(t *testing.T) { checkGPTQConvert(t, c.s, c.format) })
	}
}

func checkGPTQConvert(t *testing.T, s quant.Scheme, format string) {
	tiny := testenv.Testdata(t, "models/tiny")
	dir := t.TempDir()
	gopt := gptqOptions(t, s)
	gopt.Format = format
	r, err := Convert(tiny, filepath.Join(dir, "g"), gopt)
	if err != nil {
		t.Fatal(err)
	}
	if r.Quantized != 28 || r.Method != "gptq" {
		t.Fatalf("report %d quantized, method %s", r.Quantized, r.Method)
	}
	c, err := quantized.Open(filepath.Join(dir, "g"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !strings.Contains(c.Metadata()[ProvenanceKey], `"calibration"`) {
		t.Errorf("provenance lacks the calibration")
	}
	// GPTQ moves weights away from their nearest grid point to cancel output error: the
	// dequantized weights must differ from RTN's on a good share of entries.
	opt := DefaultOptions()
	opt.Alloc, opt.Format = Uniform(s), format
	if _, err := Convert(tiny, filepath.Join(dir, "r"), opt); err != nil {
		t.Fatal(err)
	}
	rc, _ := quantized.Open(filepath.Join(dir, "r"))
	defer rc.Close()
	name := "model.layers.2.mlp.down_proj.weight"
	gw, _ := c.Float32(name)
	rw, _ := rc.Float32(name)
	differ := 0
	for i := range gw {
		if gw[i] != rw[i] {
			differ++
		}
	}
	if differ < len(gw)/20 {
		t.Errorf("GPTQ changed only %d of %d weights relative to RTN", differ, len(gw))
	}
}

func TestGPTQRefusals(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	dst := filepath.Join(t.TempDir(), "x")
	opt := gptqOptions(t, quant.Scheme{Bits: 4, GroupSize: 128})
	opt.Calib.File = ""
	if _, err := Convert(tiny, dst, opt); err == nil || !strings.Contains(err.Error(), "--calib") {
		t.Errorf("gptq without calibration: %v", err)
	}
	opt = gptqOptions(t, quant.Scheme{Grid: quant.FP8E4M3, Bits: 8, GroupSize: quant.PerChannel, Sym: true})
	opt.Format = "qpack"
	if _, err := Convert(tiny, dst, opt); err == nil || !strings.Contains(err.Error(), "not fp8 (use blockwise)") {
		t.Errorf("gptq with fp8: %v", err)
	}
	opt = gptqOptions(t, quant.Scheme{Grid: quant.NF4, Bits: 4, GroupSize: 64, Sym: true})
	opt.Method, opt.Format = "awq", "qpack"
	if _, err := Convert(tiny, dst, opt); err == nil || !strings.Contains(err.Error(), "awq quantizes to integer grids, not nf4-g64") {
		t.Errorf("awq with nf4: %v", err)
	}
	// What GPTQ cannot do with k-quants is refused before the calibration runs, naming the rung.
	for flag, want := range map[string]string{"act-order": "use act-order with static groups", "clip": "no clipping search"} {
		opt = gptqOptions(t, q3k)
		opt.Format, opt.GPTQ.ActOrder, opt.Clip = "qpack", flag == "act-order", flag == "clip"
		_, err := Convert(tiny, dst, opt)
		if err == nil || !strings.Contains(err.Error(), "scheme q3_k") || !strings.Contains(err.Error(), want) {
			t.Errorf("gptq q3_k with --%s: %v", flag, err)
		}
	}
	opt = gptqOptions(t, quant.Scheme{Bits: 4, GroupSize: 128})
	opt.Calib.Samples = 100000
	if _, err := Convert(tiny, dst, opt); err == nil || !strings.Contains(err.Error(), "tokens") {
		t.Errorf("too little calibration text: %v", err)
	}
}

// A GPTQ conversion stopped through its context (a batch's SIGINT) returns while GPTQ is still
// calibrating — the writer no longer waits for a layer GPTQ has not reached — and leaves nothing.
func TestGPTQStopsWithItsContext(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	dir := t.TempDir()
	opt := gptqOptions(t, quant.Scheme{Bits: 4, GroupSize: 128})
	opt.Device = DeviceCPU
	opt.Calib.Samples = 16 // long enough that GPTQ is still running when the context is done
	ctx, cancel := context.WithCancel(context.Background())
	opt.Context = ctx
	var lines atomic.Int32
	opt.Log = writerFunc(func(p []byte) (int, error) {
		if strings.HasPrefix(string(p), "gptq ") && lines.Add(1) == 1 {
			cancel() // the first layer is done: stop while the rest are pending
		}
		return len(p), nil
	})
	_, err := Convert(tiny, filepath.Join(dir, "out"), opt)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a stopped GPTQ conversion returned %v, want context.Canceled", err)
	}
	if n := lines.Load(); n >= 28 {
		t.Errorf("GPTQ quantized all %d linears before the conversion stopped", n)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a stopped conversion left %s", entries[0].Name())
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// The writer's wait for a GPTQ result ends when the conversion is stopped, without the result.
func TestGPTQResultStopsWaiting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &blockRunner{results: map[string]chan gptqResult{"m": make(chan gptqResult, 1)}, ctx: ctx}
	done := make(chan error, 1)
	go func() {
		_, err := r.result("m")
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("result returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("result still waits for GPTQ after the conversion was stopped")
	}
}

// TestDeliverHandsResultsAndErrors: deliver gets each solved linear's results and hands them to
// the writer in order; a result whose module the calibration's failure has answered already does
// not block it; a failed result is the writer's error and the runner's delivery error.
func TestDeliverHandsResultsAndErrors(t *testing.T) {
	r := &blockRunner{results: map[string]chan gptqResult{}, logf: func(string, ...any) {}}
	for _, m := range []string{"a", "b", "c"} {
		r.results[m] = make(chan gptqResult, 1)
	}
	r.results["b"] <- gptqResult{err: errors.New("calibration failed")} // fail's answer
	s := quant.Scheme{Bits: 4, GroupSize: 128}
	ta, tb := &quant.Tensor{Scheme: s, N: 1}, &quant.Tensor{Scheme: s, N: 2}
	asked := 0
	solved := func(tt *quant.Tensor, err error) solveResults {
		return func() (*quant.Tensor, gptq.Stats, error) { asked++; return tt, gptq.Stats{Loss: 1}, err }
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.deliver([]*solvedLinear{
			{l: &model.Linear{Name: "a"}, s: s, results: solved(ta, nil)},
			{l: &model.Linear{Name: "b"}, s: s, results: solved(tb, nil)},
			{l: &model.Linear{Name: "c"}, s: s, results: solved(nil, errors.New("diverged"))},
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("deliver blocked on a module the calibration's failure had answered")
	}
	if asked != 3 {
		t.Errorf("deliver got %d results of 3", asked)
	}
	if got := <-r.results["a"]; got.t != ta || got.err != nil {
		t.Errorf("a: got %+v, want its tensor", got)
	}
	if got := <-r.results["b"]; got.err == nil || got.err.Error() != "calibration failed" {
		t.Errorf("b: got %+v, want the calibration's error kept", got)
	}
	if got := <-r.results["c"]; got.err == nil || !strings.Contains(got.err.Error(), "diverged") {
		t.Errorf("c: got %+v, want its error", got)
	}
	if err := r.deliveryError(); err == nil || !strings.Contains(err.Error(), "tensor c.weight: diverged") {
		t.Errorf("delivery error %v, want c's", err)
	}
}

// TestCalibMathRefusesUnknown: an unknown --calib-math is an error naming it and the choices.
func TestCalibMathRefusesUnknown(t *testing.T) {
	_, err := newBlockRunner(Options{Method: GPTQ, CalibMath: "fp8"}, nil, t.Logf)
	if err == nil || !strings.Contains(err.Error(), `"fp8"`) || !strings.Contains(err.Error(), CalibBF16) {
		t.Fatalf("got %v, want an error naming fp8 and the choices", err)
	}
}

// TestSolverReserve: the estimate of GPTQ's GPU memory for a Llama-2-70B shape is what
// solverReserve's comment says (it decides whether a 70B calibrates staged on one GPU).
func TestSolverReserve(t *testing.T) {
	cfg := &model.Config{Hidden: 8192, Intermediate: 28672}
	for _, c := range []struct {
		shards int
		gb     float64
	}{{1, 32}, {4, 25}} {
		if got := float64(solverReserve(cfg, c.shards)) / 1e9; math.Abs(got-c.gb) > 1 {
			t.Errorf("%d GPUs: %.1f GB, want about %.0f", c.shards, got, c.gb)
		}
	}
}

// TestCalibMathChoices: each --calib-math name gives the engine the rounding its comment says.
func TestCalibMathChoices(t *testing.T) {
	for name, want := range map[string]model.GPUOptions{
		"":            {TF32: true, F16: true},
		CalibF16:      {TF32: true, F16: true},
		CalibTF32:     {TF32: true},
		CalibBF16:     {TF32: true, BF16: true},
		CalibGramBF16: {TF32: true, GramBF16: true},
		CalibFP32:     {},
	} {
		if got, err := calibEngineOptions(name); err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", name, got, err, want)
		}
	}
}

// TestBundlesKeepSharedSourcesTogether: groups that share a Hessian (experts 1 and 3
// calibrated on every token use GroupGateUp's) form one bundle, at the first's place; the rest
// keep their order.
func TestBundlesKeepSharedSourcesTogether(t *testing.T) {
	g, e := model.GroupGateUp, model.ExpertGateUp
	sources := []model.Group{g, e(0), g, e(2), g, model.ExpertDown(0)}
	got, want := bundlesOf(sources), [][]int{{0, 2, 4}, {1}, {3}, {5}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("bundlesOf = %v, want %v", got, want)
	}
	if got := bundlesOf(nil); len(got) != 0 {
		t.Errorf("bundlesOf(nil) = %v", got)
	}
}

// TestAssignBundlesBalancesGPUs: the costliest bundles go first, each to the least loaded GPU
// (the first on ties), every bundle to exactly one GPU, each GPU's list in order.
func TestAssignBundlesBalancesGPUs(t *testing.T) {
	for _, c := range []struct {
		costs []int
		gpus  int
		want  [][]int
	}{
		{[]int{5, 5, 5, 5, 5, 5, 5, 5}, 4, [][]int{{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
		{[]int{1, 9, 3, 4, 5}, 2, [][]int{{1, 2}, {0, 3, 4}}}, // 9 | 5, 4 | 3 on 9 | 1 on 10
		{[]int{7, 0, 2}, 3, [][]int{{0}, {2}, {1}}},
		{[]int{4, 4}, 3, [][]int{{0}, {1}, nil}},
	} {
		got := assignBundles(c.costs, c.gpus)
		if !slices.EqualFunc(got, c.want, slices.Equal) {
			t.Errorf("assignBundles(%v, %d) = %v, want %v", c.costs, c.gpus, got, c.want)
		}
	}
}

// TestGPTQReturnsFreeMemoryOnce: a calibration gives the heap's free memory back to the system
// once, as its last block calibrates (returnFreeMemory), not for every block.
func TestGPTQReturnsFreeMemoryOnce(t *testing.T) {
	var calls atomic.Int32
	called := make(chan struct{}, 8)
	defer func(f func()) { freeOSMemory = f }(freeOSMemory)
	freeOSMemory = func() {
		calls.Add(1)
		called <- struct{}{}
	}
	opt := gptqOptions(t, quant.Scheme{Bits: 4, GroupSize: 64})
	opt.Device = DeviceCPU
	if _, err := Convert(testenv.Testdata(t, "models/tiny"), filepath.Join(t.TempDir(), "g"), opt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("the free memory was never returned")
	}
	time.Sleep(50 * time.Millisecond) // a second call, if one were made, would have come by now
	if n := calls.Load(); n != 1 {
		t.Errorf("free memory returned %d times, want once", n)
	}
}
