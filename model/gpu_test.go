package model

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
	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/internal/gputest"
)

// gpuPTX lets a GPU run try kernels compiled there before the embedded PTX is regenerated:
// go test -args -model.ptx=/path/model.ptx
var gpuPTX = flag.String("model.ptx", "", "load this PTX instead of the embedded kernels/model.ptx")

func TestGPUPTXIsFresh(t *testing.T) {
	if err := cuda.CheckPTX(modelPTX, modelSource); err != nil {
		t.Fatalf("kernels/model.ptx: %v", err)
	}
	if err := cuda.CheckCubin(modelCubinSM90, modelPTX); err != nil {
		t.Fatalf("kernels/model.sm_90.cubin: %v", err)
	}
}

// openGPU opens GPU 0 and an engine for cfg that poisons its work buffers and runs blocks in
// chunks of chunkRows tokens; the test is skipped without a GPU.
func openGPU(tb testing.TB, cfg *Config, opt GPUOptions, chunkRows int) *GPU {
	tb.Helper()
	return engineOn(tb, gputest.Open(tb), cfg, opt, chunkRows)
}

// openGPUs is openGPU on n GPUs (gputest.OpenMany: several handles of one GPU where there are fewer).
func openGPUs(tb testing.TB, cfg *Config, opt GPUOptions, chunkRows, n int) []*GPU {
	tb.Helper()
	var es []*GPU
	for _, dev := range gputest.OpenMany(tb, n) {
		es = append(es, engineOn(tb, dev, cfg, opt, chunkRows))
	}
	return es
}

// engineOn makes a poisoned engine on dev (chunkRows: 0 for the default), closed with tb.
func engineOn(tb testing.TB, dev *cuda.Device, cfg *Config, opt GPUOptions, chunkRows int) *GPU {
	tb.Helper()
	e, err := newGPU(dev, cfg, opt, gputest.PTX(tb, modelPTX, *gpuPTX), gputest.Cubins(*gpuPTX, modelCubinSM90)...)
	if err != nil {
		tb.Fatal(err)
	}
	e.poison = true
	if chunkRows > 0 {
		e.chunkRows = chunkRows
	}
	tb.Cleanup(func() { e.Close() })
	return e
}

// gpuTestConfigs cover every family's peculiarity: GQA, q/k/v biases with tied embeddings,
// q/k norms with a head_dim that is not hidden/heads, a sliding window shorter than the sequence.
var gpuTestConfigs = []struct {
	name, json string
	bias       bool
}{
	{"llama-gqa", `{"model_type": "llama", "hidden_size": 96, "intermediate_size": 160, "num_hidden_layers": 2,
		"num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 301}`, false},
	{"qwen2-bias-tied", `{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 157, "tie_word_embeddings": true}`, true},
	{"qwen3-qknorm", `{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 211}`, false},
	{"mistral-window", `{"model_type": "mistral", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
		"num_attention_heads": 8, "num_key_value_heads": 1, "vocab_size": 97, "sliding_window": 5}`, false},
	// and the mixtures of experts of moe_test.go
	{"mixtral", moeTestConfigs[0].json, moeTestConfigs[0].bias},
	{"qwen3_moe", moeTestConfigs[1].json, moeTestConfigs[1].bias},
	{"qwen2_moe", moeTestConfigs[2].json, moeTestConfigs[2].bias},
}

// groupCount is how many linear groups the blocks of cfg have (Block.Groups).
func groupCount(cfg *Config) int {
	n := 0
	for i := range cfg.Layers {
		switch {
		case !cfg.SparseBlock(i):
			n += 4
		case cfg.MoE.SharedIntermediate == 0:
			n += 3 + 2*cfg.MoE.Experts // qkv, o, every token's gate_up input, two per expert
		default:
			n += 4 + 2*cfg.MoE.Experts // and the shared expert's down
		}
	}
	return n
}

// freshRand is a generator seeded from the clock (logged, to reproduce a failure).
func freshRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 7))
}

func randomModel(t *testing.T, cfg *Config, bias bool, r *rand.Rand) *Model {
	t.Helper()
	m, err := Load(cfg, randomWeights(cfg, bias, !cfg.TieEmbeddings, r))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func randomIDs(r *rand.Rand, n, vocab int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = r.IntN(vocab)
	}
	return ids
}

// TestGPUForwardMatchesCPU: logits, perplexity and a comparison of two models on the GPU equal
// the CPU forward pass's on fresh random models and tokens of awkward lengths, with attention's
// products in one band and in bands of 5 queries (the last one shorter).
func TestGPUForwardMatchesCPU(t *testing.T) {
	for _, tc := range gpuTestConfigs {
		for _, band := range []int{0, 5} {
			t.Run(fmt.Sprintf("%s/band%d", tc.name, band), func(t *testing.T) {
				testGPUForwardMatchesCPU(t, tc.json, tc.bias, band)
			})
		}
	}
}

func testGPUForwardMatchesCPU(t *testing.T, config string, bias bool, band int) {
	cfg := mustConfig(t, config)
	e := openGPU(t, cfg, GPUOptions{}, 40) // 40 tokens: several chunks of sequences
	e.band = band
	r := freshRand(t)
	m, other := randomModel(t, cfg, bias, r), randomModel(t, cfg, bias, r)
	ids := randomIDs(r, 37, cfg.Vocab)
	want, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.Logits(m, ids)
	if err != nil {
		t.Fatal(err)
	}
	assertClose(t, "logits", got, want, 1e-4)

	ids = randomIDs(r, 5*13+3, cfg.Vocab)
	wantP, err := Perplexity(m, ids, 13, 0)
	if err != nil {
		t.Fatal(err)
	}
	gotP, err := e.Perplexity(m, ids, 13, 0)
	if err != nil {
		t.Fatal(err)
	}
	if gotP.Tokens != wantP.Tokens || math.Abs(gotP.MeanNLL-wantP.MeanNLL) > 1e-5*wantP.MeanNLL {
		t.Errorf("perplexity: GPU %+v, CPU %+v", gotP, wantP)
	}

	wantC, err := Compare(m, other, ids, 13, 4)
	if err != nil {
		t.Fatal(err)
	}
	gotC, err := e.Compare(m, other, ids, 13, 4)
	if err != nil {
		t.Fatal(err)
	}
	checkComparison(t, gotC, wantC)
}

// TestGPUReducedPrecisionForward: with TF32 or BF16 GEMMs the GPU's logits stay within those
// formats' rounding of the CPU's float32 ones (relative L2 error: TF32 under 3e-3, BF16 under
// 5e-2), and BF16's error is the larger (its 8-bit significand against TF32's 11), so the mode
// took effect.
func TestGPUReducedPrecisionForward(t *testing.T) {
	cfg := mustConfig(t, gpuTestConfigs[0].json)
	r := freshRand(t)
	m := randomModel(t, cfg, false, r)
	ids := randomIDs(r, 37, cfg.Vocab)
	want, err := m.Logits(ids)
	if err != nil {
		t.Fatal(err)
	}
	relErr := func(opt GPUOptions) float64 {
		got, err := openGPU(t, cfg, opt, 40).Logits(m, ids)
		if err != nil {
			t.Fatal(err)
		}
		return relL2(got, want)
	}
	tf32, bf16 := relErr(GPUOptions{TF32: true}), relErr(GPUOptions{TF32: true, BF16: true})
	f16 := relErr(GPUOptions{TF32: true, F16: true})
	t.Logf("logits' relative error: TF32 %.2e, BF16 %.2e, scaled FP16 %.2e", tf32, bf16, f16)
	if !(tf32 < 3e-3) || !(bf16 < 5e-2) || !(bf16 > 1.5*tf32) {
		t.Errorf("relative errors TF32 %.2e, BF16 %.2e: want TF32 < 3e-3, BF16 < 5e-2 and above 1.5 × TF32's", tf32, bf16)
	}
	if !(f16 < 2*tf32) || !(bf16 > 3*f16) {
		t.Errorf("relative errors TF32 %.2e, BF16 %.2e, FP16 %.2e: want FP16 within 2 × TF32's and BF16 over 3 × FP16's", tf32, bf16, f16)
	}
}

// TestGPUToBF16: the rounding kernel gives fp.F32ToBF16 on random values of every magnitude,
// ties, subnormals, infinities and NaNs.
func TestGPUToBF16(t *testing.T) {
	e := openGPU(t, mustConfig(t, gpuTestConfigs[0].json), GPUOptions{}, 0)
	r := freshRand(t)
	x := make([]float32, 100003)
	for i := range x {
		x[i] = math.Float32frombits(r.Uint32())
	}
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.Float32frombits(0x3f808000), math.Float32frombits(0x3f818000), math.Float32frombits(0x00008000), math.MaxFloat32}
	copy(x, special)
	src, err := e.dev.Alloc(4 * len(x))
	if err != nil {
		t.Fatal(err)
	}
	defer e.dev.Free(src)
	dst, err := e.work("test.bf16", 2*len(x))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.dev.CopyToDevice(src, cuda.Bytes(x)); err != nil {
		t.Fatal(err)
	}
	if err := e.toBF16(dst, src, len(x)); err != nil {
		t.Fatal(err)
	}
	got := make([]uint16, len(x))
	if err := e.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := e.dev.CopyFromDevice(cuda.Bytes(got), dst); err != nil {
		t.Fatal(err)
	}
	for i, v := range x {
		if want := fp.F32ToBF16(v); got[i] != want {
			t.Fatalf("x[%d] = %g (%#08x): GPU %#04x, want %#04x", i, v, math.Float32bits(v), got[i], want)
		}
	}
}

// TestGPUAddGram: AddGram's tiles of the upper triangle, made whole by FinishGram, give the
// Gram matrix of x (with BF16 or GramBF16, of x rounded to bfloat16; with F16, of x scaled,
// rounded to FP16 and scaled back) summed in float32 — within 1e-5 of the float64 sum — over two
// accumulations, at a width of one tile and at one of four uneven tiles; with F16 also at
// magnitudes beyond FP16's range and far below its normal numbers.
func TestGPUAddGram(t *testing.T) {
	for _, opt := range []GPUOptions{{}, {BF16: true}, {TF32: true, GramBF16: true}, {F16: true}} {
		for _, cols := range []int{72, 1100} {
			for _, mag := range []float64{1, 3e6, 1e-9} {
				if mag != 1 && !opt.F16 {
					continue
				}
				t.Run(fmt.Sprintf("%+v/cols=%d/mag=%g", opt, cols, mag), func(t *testing.T) { testAddGram(t, opt, cols, mag) })
			}
		}
	}
}

func testAddGram(t *testing.T, opt GPUOptions, cols int, mag float64) {
	e := openGPU(t, mustConfig(t, gpuTestConfigs[0].json), opt, 0)
	r := freshRand(t)
	const rows = 300
	x := make([]float32, rows*cols)
	for i := range x {
		x[i] = float32(mag * r.NormFloat64())
	}
	rounded := make([]float64, len(x))
	switch {
	case opt.F16:
		copy(rounded, scaledF16(x))
	case opt.BF16 || opt.GramBF16:
		for i, v := range x {
			rounded[i] = float64(fp.BF16ToF32(fp.F32ToBF16(v)))
		}
	default:
		for i, v := range x {
			rounded[i] = float64(v)
		}
	}
	want := make([]float64, cols*cols)
	for row := range rows {
		xr := rounded[row*cols : (row+1)*cols]
		for i, a := range xr {
			for j, b := range xr {
				want[i*cols+j] += 2 * a * b
			}
		}
	}
	dx, err := e.dev.Alloc(4 * len(x))
	if err != nil {
		t.Fatal(err)
	}
	defer e.dev.Free(dx)
	sum, err := e.dev.Alloc(4 * cols * cols)
	if err != nil {
		t.Fatal(err)
	}
	defer e.dev.Free(sum)
	if err := e.dev.CopyToDevice(dx, cuda.Bytes(x)); err != nil {
		t.Fatal(err)
	}
	if err := e.dev.Fill32(sum, 0, cols*cols); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := e.AddGram(sum, dx, rows, cols); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Synchronize(); err != nil {
		t.Fatal(err)
	}
	// NaN below the diagonal (column-major: row > column): FinishGram must write all of it.
	part := make([]float32, cols*cols)
	if err := e.dev.CopyFromDevice(cuda.Bytes(part), sum); err != nil {
		t.Fatal(err)
	}
	for c := range cols {
		for r := c + 1; r < cols; r++ {
			part[r+c*cols] = float32(math.NaN())
		}
	}
	if err := e.dev.CopyToDevice(sum, cuda.Bytes(part)); err != nil {
		t.Fatal(err)
	}
	if err := e.FinishGram(sum, cols); err != nil {
		t.Fatal(err)
	}
	if err := e.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got32 := make([]float32, cols*cols)
	if err := e.dev.CopyFromDevice(cuda.Bytes(got32), sum); err != nil {
		t.Fatal(err)
	}
	got := make([]float64, len(got32))
	for i, v := range got32 {
		got[i] = float64(v)
	}
	if rel := relativeDiff(got, want); !(rel < 1e-5) {
		t.Errorf("Gram matrix: relative error %.2e against the float64 sum", rel)
	}
	for i := range cols {
		for j := range i {
			if got32[i*cols+j] != got32[j*cols+i] {
				t.Fatalf("Gram matrix not symmetric at (%d, %d): %g and %g", i, j, got32[i*cols+j], got32[j*cols+i])
			}
		}
	}
}

// scaledF16 is what to_f16_scaled makes of x, scaled back: each value times 2^s rounded to FP16
// and divided by 2^s, s putting the largest magnitude in [2^14, 2^15).
func scaledF16(x []float32) []float64 {
	var amax float64
	for _, v := range x {
		amax = max(amax, math.Abs(float64(v)))
	}
	s := 0
	if amax > 0 && !math.IsInf(amax, 0) {
		_, e := math.Frexp(amax)
		s = max(-60, min(60, 15-e))
	}
	out := make([]float64, len(x))
	for i, v := range x {
		h := fp.F32ToF16(float32(math.Ldexp(float64(v), s)))
		out[i] = math.Ldexp(float64(fp.F16ToF32(h)), -s)
	}
	return out
}

// TestGPUToF16Scaled: the scaling kernel gives scaledF16's values (fp.F32ToF16 after the shift) on
// random values of one magnitude, several, with ties, zeros and a NaN, and reports the shift and
// alpha = 2^−(s+t) for another operand's shift t.
func TestGPUToF16Scaled(t *testing.T) {
	e := openGPU(t, mustConfig(t, gpuTestConfigs[0].json), GPUOptions{F16: true}, 0)
	r := freshRand(t)
	for _, mag := range []float64{1, 7e4, 3e-7, 1e-30} {
		x := make([]float32, 50003)
		for i := range x {
			x[i] = float32(mag * r.NormFloat64() * math.Exp(4*r.NormFloat64()))
		}
		x[7], x[8] = 0, float32(math.Copysign(0, -1))
		x[9] = float32(math.Ldexp(1+1.0/2048, -3)) // an FP16 tie once scaled (if 2^−3 is within range)
		x[11] = float32(math.NaN())                // left out of the amax, kept NaN
		for _, off := range []int{0, 1} {          // whole vectors (to_f16_scaled_vec8) and one element per thread
			testToF16Scaled(t, e, x[off:], mag)
		}
	}
}

// testToF16Scaled converts x placed 50003 − len(x) elements past a 16-byte boundary (one: the
// kernels of one element per thread) and checks every element, the shift and the alpha.
func testToF16Scaled(t *testing.T, e *GPU, x []float32, mag float64) {
	off := 50003 - len(x)
	finite := slices.Clone(x)
	nan := slices.IndexFunc(finite, func(v float32) bool { return v != v })
	finite[nan] = 0
	want := scaledF16(finite)
	src, err := e.dev.Alloc(4 * (len(x) + off))
	if err != nil {
		t.Fatal(err)
	}
	defer e.dev.Free(src)
	dst, err := e.work("test.f16", 2*(len(x)+off))
	if err != nil {
		t.Fatal(err)
	}
	src, dst = src.Add(4*off), dst.Add(2*off)
	if err := e.dev.CopyToDevice(src, cuda.Bytes(x)); err != nil {
		t.Fatal(err)
	}
	other, err := e.dev.Alloc(4)
	if err != nil {
		t.Fatal(err)
	}
	defer e.dev.Free(other)
	if err := e.dev.CopyToDevice(other, cuda.Bytes([]int32{-5})); err != nil {
		t.Fatal(err)
	}
	if err := e.toF16Scaled(dst, src, len(x), other, e.scalar(f16Shift), e.scalar(f16Alpha)); err != nil {
		t.Fatal(err)
	}
	if err := e.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]uint16, len(x))
	if err := e.dev.CopyFromDevice(cuda.Bytes(got), dst); err != nil {
		t.Fatal(err)
	}
	var sc [3]uint32
	if err := e.dev.CopyFromDevice(cuda.Bytes(sc[:]), e.scalars); err != nil {
		t.Fatal(err)
	}
	shift := int(int32(sc[f16Shift]))
	if alpha := math.Float32frombits(sc[f16Alpha]); float64(alpha) != math.Ldexp(1, -(shift-5)) {
		t.Errorf("magnitude %g, offset %d: alpha %g with shift %d and the other's −5, want 2^%d", mag, off, alpha, shift, -(shift - 5))
	}
	// The alphas for the same converted input and other operands (cuda.Device.F16Alpha): +7, itself.
	if err := e.dev.CopyToDevice(other, cuda.Bytes([]int32{7})); err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		other cuda.DevicePtr
		t     int
	}{{other, 7}, {0, shift}} {
		alpha := []float32{0}
		err := e.dev.F16Alpha(e.scalar(f16Shift), o.other, e.scalar(f16Alpha), e.stream)
		if err == nil {
			err = e.Synchronize()
		}
		if err == nil {
			err = e.dev.CopyFromDevice(cuda.Bytes(alpha), e.scalar(f16Alpha))
		}
		if err != nil {
			t.Fatal(err)
		}
		if float64(alpha[0]) != math.Ldexp(1, -(shift+o.t)) {
			t.Errorf("magnitude %g, offset %d: F16Alpha %g with shift %d and the other's %d, want 2^%d", mag, off, alpha[0], shift, o.t, -(shift + o.t))
		}
	}
	for i, h := range got {
		v := math.Ldexp(float64(fp.F16ToF32(h)), -shift)
		if i == nan {
			if !math.IsNaN(v) {
				t.Errorf("magnitude %g, offset %d: NaN became %g", mag, off, v)
			}
			continue
		}
		if v != want[i] && !(v == 0 && want[i] == 0) {
			t.Fatalf("magnitude %g, offset %d, x[%d] = %g: GPU %g (FP16 %#04x, shift %d), want %g", mag, off, i, x[i], v, h, shift, want[i])
		}
	}
}

func checkComparison(t *testing.T, got, want Comparison) {
	t.Helper()
	near := func(a, b, tol float64) bool { return math.Abs(a-b) <= tol*max(math.Abs(b), 1e-3) }
	ok := near(got.Reference.MeanNLL, want.Reference.MeanNLL, 1e-5) && near(got.Test.MeanNLL, want.Test.MeanNLL, 1e-5) &&
		near(got.MeanKL, want.MeanKL, 1e-4) && near(got.P99KL, want.P99KL, 1e-3) &&
		math.Abs(got.Top1Agreement-want.Top1Agreement) <= 1.0/float64(want.Reference.Tokens)
	if !ok {
		t.Errorf("comparison: GPU %+v\nCPU %+v", got, want)
	}
}

// gramRecorder accumulates each group's input Gram matrix xᵀx, on the CPU through Observe and
// on the GPU through ObserveGPU, and scales each updated linear's weights by 0.9 so that the
// replacement's effect on later blocks is checked too (unless observeOnly).
type gramRecorder struct {
	e           *GPU
	observeOnly bool
	k           map[string]int
	cpu         map[string][]float64
	gpu         map[string]cuda.DevicePtr
	grams       map[string][]float64 // the GPU's, downloaded at Update
}

func newGramRecorder(e *GPU) *gramRecorder {
	return &gramRecorder{e: e, k: map[string]int{}, cpu: map[string][]float64{}, gpu: map[string]cuda.DevicePtr{}, grams: map[string][]float64{}}
}

func (r *gramRecorder) Observe(block int, g Group, x []float32, rows, cols int) error {
	key := fmt.Sprintf("%d/%s", block, g)
	s := r.cpu[key]
	if s == nil {
		s = make([]float64, cols*cols)
		r.cpu[key], r.k[key] = s, cols
	}
	for t := range rows {
		xr := x[t*cols : (t+1)*cols]
		for i, a := range xr {
			for j, b := range xr {
				s[i*cols+j] += float64(a) * float64(b)
			}
		}
	}
	return nil
}

func (r *gramRecorder) ObserveGPU(block int, g Group, x cuda.DevicePtr, rows, cols int) error {
	key := fmt.Sprintf("%d/%s", block, g)
	p, ok := r.gpu[key]
	if !ok {
		var err error
		if p, err = r.e.dev.Alloc(4 * cols * cols); err != nil {
			return err
		}
		if err := r.e.dev.Fill32(p, 0, cols*cols); err != nil {
			return err
		}
		r.gpu[key], r.k[key] = p, cols
	}
	return r.e.AddGram(p, x, rows, cols)
}

func (r *gramRecorder) Update(b *Block, groups []Group) error {
	for _, g := range groups {
		key := fmt.Sprintf("%d/%s", b.Index, g)
		if p, ok := r.gpu[key]; ok {
			if err := r.e.FinishGram(p, r.k[key]); err != nil {
				return err
			}
			if err := r.e.Synchronize(); err != nil {
				return err
			}
			k := r.k[key]
			s := make([]float32, k*k)
			if err := r.e.dev.CopyFromDevice(cuda.Bytes(s), p); err != nil {
				return err
			}
			r.e.dev.Free(p)
			delete(r.gpu, key) // a later step may observe the group again (AWQ+GPTQ's steps)
			r.grams[key] = make([]float64, k*k)
			for i, v := range s {
				r.grams[key][i] = float64(v)
			}
		}
	}
	if r.observeOnly {
		return nil
	}
	return r.replaceWeights(b, groups)
}

// replaceWeights scales the groups' weights by 0.9, as a calibrator's quantization would change them.
func (r *gramRecorder) replaceWeights(b *Block, groups []Group) error {
	for _, g := range groups {
		for _, l := range b.Linears(g) {
			w := slices.Clone(l.W)
			for i := range w {
				w[i] *= 0.9
			}
			if err := l.SetWeight(w); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestGPUCalibrateMatchesCPU: the Gram matrices of every group's inputs gathered on the GPU
// (several chunks of sequences) equal those of the CPU calibration, with weights replaced
// between groups (true-sequential) or per block, for a dense model and a mixture of experts
// with a shared expert.
func TestGPUCalibrateMatchesCPU(t *testing.T) {
	observed := ExpertObservation{AllTokens: func(block, e int) bool { return (block+e)%3 == 0 }, WeightPower: 2}
	for _, tc := range []struct {
		name, json string
		experts    ExpertObservation
	}{{"llama", gpuTestConfigs[0].json, ExpertObservation{}}, {"qwen2_moe", moeTestConfigs[2].json, ExpertObservation{}},
		{"qwen2_moe/all-tokens+weighted", moeTestConfigs[2].json, observed}} {
		for _, trueSeq := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/true-sequential=%v", tc.name, trueSeq), func(t *testing.T) {
				testGPUCalibrate(t, tc.json, trueSeq, tc.experts)
			})
		}
	}
}

func testGPUCalibrate(t *testing.T, js string, trueSeq bool, experts ExpertObservation) {
	cfg := mustConfig(t, strings.Replace(js, `"num_hidden_layers": 2`, `"num_hidden_layers": 3`, 1))
	opt := CalibrateOptions{TrueSequential: trueSeq, Experts: experts}
	compareGPUCalibration(t, cfg, false, opt, opt)
}

// TestGPUStagedCalibrationIsExact: the staged true-sequential calibration of dense blocks
// (stagedState: every GEMM once per block) gathers the Gram matrices of the recomputing passes
// bit for bit, the later blocks' included (so the hidden states it passes on are the same too),
// for every dense family, also after a first step that updates every group (AWQ+GPTQ's).
func TestGPUStagedCalibrationIsExact(t *testing.T) {
	allFirst := func(b *Block) [][]Group { return append([][]Group{b.Groups()}, b.Stages()...) }
	for _, tc := range gpuTestConfigs[:4] {
		for _, opt := range []CalibrateOptions{{TrueSequential: true}, {Steps: allFirst}} {
			t.Run(fmt.Sprintf("%s/all-first=%v", tc.name, opt.Steps != nil), func(t *testing.T) {
				cfg, w, seqs := threeBlockCase(t, tc.json, tc.bias)
				var grams [2]map[string][]float64
				for i, staged := range []bool{true, false} {
					e := openGPU(t, cfg, GPUOptions{}, 50)
					e.noStaging = !staged
					rec := newGramRecorder(e)
					m, err := Load(cfg, w)
					if err != nil {
						t.Fatal(err)
					}
					if err := e.Calibrate(m, seqs, rec, opt); err != nil {
						t.Fatal(err)
					}
					if _, kept := e.scratch["keep.attn"]; kept != staged {
						t.Fatalf("staged=%v: keep.attn allocated: %v", staged, kept)
					}
					grams[i] = rec.grams
				}
				sameGrams(t, cfg, grams[0], grams[1], "the recomputing passes'")
			})
		}
	}
}

// TestGPUSameInputConvertedOnce: linears that read the same input (q/k/v, gate/up, an expert's
// gate/up) convert it to 16 bits once (readSame), with the same bits as converting it for each:
// a true-sequential calibration's Gram matrices and the logits, with FP16 and BF16, every family.
func TestGPUSameInputConvertedOnce(t *testing.T) {
	for _, tc := range gpuTestConfigs {
		for _, opt := range []GPUOptions{{TF32: true, F16: true}, {TF32: true, BF16: true}} {
			t.Run(fmt.Sprintf("%s/f16=%v", tc.name, opt.F16), func(t *testing.T) {
				cfg, w, seqs := threeBlockCase(t, tc.json, tc.bias)
				var grams [2]map[string][]float64
				var logits [2][]float32
				for i, sharing := range []bool{true, false} {
					e := openGPU(t, cfg, opt, 50)
					e.noSharing = !sharing
					m, err := Load(cfg, w)
					if err != nil {
						t.Fatal(err)
					}
					if logits[i], err = e.Logits(m, seqs[0]); err != nil {
						t.Fatal(err)
					}
					rec := newGramRecorder(e)
					if err := e.Calibrate(m, seqs, rec, CalibrateOptions{TrueSequential: true}); err != nil {
						t.Fatal(err)
					}
					grams[i] = rec.grams
				}
				if !slices.Equal(logits[0], logits[1]) {
					t.Errorf("logits differ (relative %.2e)", relL2(logits[0], logits[1]))
				}
				sameGrams(t, cfg, grams[0], grams[1], "those converted for each linear")
			})
		}
	}
}

// threeBlockCase is a fresh random model of the family js (three blocks) and five sequences
// of 23 tokens to calibrate it on.
func threeBlockCase(t *testing.T, js string, bias bool) (*Config, *MapWeights, [][]int) {
	cfg := mustConfig(t, strings.Replace(js, `"num_hidden_layers": 2`, `"num_hidden_layers": 3`, 1))
	r := freshRand(t)
	w := randomWeights(cfg, bias, !cfg.TieEmbeddings, r)
	seqs := make([][]int, 5)
	for i := range seqs {
		seqs[i] = randomIDs(r, 23, cfg.Vocab)
	}
	return cfg, w, seqs
}

// sameGrams wants got to hold every group of cfg's blocks, each Gram matrix equal to want's bit
// for bit.
func sameGrams(t *testing.T, cfg *Config, got, want map[string][]float64, wantName string) {
	t.Helper()
	if len(got) != groupCount(cfg) {
		t.Fatalf("observed %d groups, want %d", len(got), groupCount(cfg))
	}
	for key, w := range want {
		if !slices.Equal(got[key], w) {
			t.Errorf("%s: Gram matrix differs from %s (relative %.2e)", key, wantName, relativeDiff(got[key], w))
		}
	}
}

// TestGPUObserveOnlyMatchesCPU: an observe-only calibration on the GPU (one pass per block)
// sees the same group inputs as the CPU's two-pass calibration with unchanged weights.
func TestGPUObserveOnlyMatchesCPU(t *testing.T) {
	for _, tc := range gpuTestConfigs {
		t.Run(tc.name, func(t *testing.T) {
			compareGPUCalibration(t, mustConfig(t, tc.json), tc.bias, CalibrateOptions{}, CalibrateOptions{ObserveOnly: true})
		})
	}
}

// compareGPUCalibration calibrates a fresh random model of cfg on the CPU with cpuOpt and on the
// GPU with gpuOpt (in chunks of 50 tokens), each observer replacing the weights it updates
// unless gpuOpt observes only, and wants every group's Gram matrix of the two within 1e-5.
func compareGPUCalibration(t *testing.T, cfg *Config, bias bool, cpuOpt, gpuOpt CalibrateOptions) {
	e := openGPU(t, cfg, GPUOptions{}, 50)
	r := freshRand(t)
	w := randomWeights(cfg, bias, !cfg.TieEmbeddings, r)
	seqs := make([][]int, 5)
	for i := range seqs {
		seqs[i] = randomIDs(r, 23, cfg.Vocab)
	}
	onCPU, onGPU := newGramRecorder(e), newGramRecorder(e)
	onCPU.observeOnly, onGPU.observeOnly = gpuOpt.ObserveOnly, gpuOpt.ObserveOnly
	for _, run := range []func(m *Model) error{
		func(m *Model) error { return Calibrate(m, seqs, onCPU, cpuOpt) },
		func(m *Model) error { return e.Calibrate(m, seqs, onGPU, gpuOpt) },
	} {
		m, err := Load(cfg, w)
		if err != nil {
			t.Fatal(err)
		}
		if err := run(m); err != nil {
			t.Fatal(err)
		}
	}
	if len(onGPU.grams) != groupCount(cfg) {
		t.Fatalf("GPU calibration observed %d groups, want %d", len(onGPU.grams), groupCount(cfg))
	}
	for key, want := range onCPU.cpu {
		if rel := relativeDiff(onGPU.grams[key], want); !(rel < 1e-5) {
			t.Errorf("%s: Gram matrix relative error %.2e", key, rel)
		}
	}
}

// relativeDiff is ‖got − want‖ / ‖want‖, or ‖got‖ where want is zero (an expert no token was
// routed to).
func relativeDiff(got, want []float64) float64 {
	var num, den float64
	for i := range want {
		num += (got[i] - want[i]) * (got[i] - want[i])
		den += want[i] * want[i]
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// TestGPUProbeLogits: the GPU forward pass of the shared models against transformers' logits,
// within the acceptance bound (1e-3 × max |logit|) with float32 and with TF32 GEMMs.
func TestGPUProbeLogits(t *testing.T) {
	for _, dir := range []string{tinyDir, smallLlamaDir, tinyMoEDir} {
		m := openModel(t, dir)
		if dir == tinyMoEDir { // its experts' routing is the most sensitive to TF32: the bf16 reference's frequencies
			m = openBF16Reference(t, dir)
		}
		for _, tf32 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/tf32=%v", dir, tf32), func(t *testing.T) {
				e := openGPU(t, m.Config, GPUOptions{TF32: tf32}, 0)
				checkProbeLogitsOf(t, func(ids []int) ([]float32, error) { return e.Logits(m, ids) }, dir, 1e-3)
			})
		}
	}
}

// TestGPUPerplexity: the reference perplexities (64×512 held-out tokens) on the GPU, within the
// acceptance bounds (tiny 58.92 ± 0.05, small-llama 8.657 ± 0.005, tiny-moe 9.887 ± 0.01).
func TestGPUPerplexity(t *testing.T) {
	for _, tc := range []struct {
		dir  string
		open func(testing.TB, string) *Model
		tol  float64
	}{{tinyDir, openModel, 0.05}, {smallLlamaDir, openBF16Reference, 0.005}, {tinyMoEDir, openBF16Reference, 0.01}} {
		m := tc.open(t, tc.dir)
		e := openGPU(t, m.Config, GPUOptions{}, 0)
		res, err := e.Perplexity(m, heldoutIDs(t, tc.dir), 512, 64)
		if err != nil {
			t.Fatal(err)
		}
		want := referencePerplexity(t, tc.dir)
		t.Logf("%s: GPU perplexity %.4f over %d tokens, reference %.4f", tc.dir, res.Perplexity, res.Tokens, want)
		if res.Tokens != 64*511 || math.Abs(res.Perplexity-want) > tc.tol {
			t.Errorf("%s: perplexity %.4f over %d tokens, want %.4f ± %g over %d", tc.dir, res.Perplexity, res.Tokens, want, tc.tol, 64*511)
		}
	}
}

// TestGPUEvalProgress: the GPU evaluations tell their progress per pass, ending at the total.
func TestGPUEvalProgress(t *testing.T) {
	cfg := mustConfig(t, gpuTestConfigs[0].json)
	e := openGPU(t, cfg, GPUOptions{}, 0)
	r := freshRand(t)
	m := randomModel(t, cfg, false, r)
	ids := randomIDs(r, 7*16, cfg.Vocab)
	var last, calls int
	p := func(done, total int) {
		if total != 7 || done <= last {
			t.Errorf("progress %d of %d after %d", done, total, last)
		}
		last, calls = done, calls+1
	}
	if _, err := e.PerplexityProgress(m, ids, 16, 0, p); err != nil {
		t.Fatal(err)
	}
	if last != 7 || calls == 0 {
		t.Errorf("perplexity: progress ended at %d after %d calls", last, calls)
	}
	last, calls = 0, 0
	if _, err := e.CompareProgress(m, m, ids, 16, 0, p); err != nil {
		t.Fatal(err)
	}
	if last != 7 || calls == 0 {
		t.Errorf("compare: progress ended at %d after %d calls", last, calls)
	}
}

// TestGPULinearKLMatchesCPU: the GPU probe gives the CPU probe's KL for every linear of fresh
// random models of every family, in one sweep and in one sweep per block, on one GPU and with the
// streams dealt to two and three (LinearKLSharded; two sweeps with the smaller memory), in float32
// and with the GEMMs' 16-bit operands (where a swapped weight must reach the 16-bit copy).
func TestGPULinearKLMatchesCPU(t *testing.T) {
	for _, tc := range gpuTestConfigs {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.json)
			r := freshRand(t)
			m := randomModel(t, cfg, tc.bias, r)
			seqs := probeSeqs(r, 3, 11, cfg.Vocab)
			want, err := LinearKL(m, seqs, noisy(0.2), 1<<30, nil)
			if err != nil {
				t.Fatal(err)
			}
			type run struct {
				gpus int
				mem  int64
				opt  GPUOptions
				tol  float64
			}
			runs := []run{{1, 1 << 30, GPUOptions{}, 1e-3}, {1, 9 * streamBytes(m, seqs), GPUOptions{}, 1e-3}, {2, 1 << 30, GPUOptions{}, 1e-3},
				{3, 1 << 30, GPUOptions{}, 1e-3}, {3, 4 * streamBytes(m, seqs), GPUOptions{}, 1e-3}}
			if !cfg.IsMoE() { // 16-bit operands flip a router's near-ties, and an expert's KL with them
				runs = append(runs, run{1, 1 << 30, GPUOptions{TF32: true, F16: true}, 0.03}, run{3, 1 << 30, GPUOptions{TF32: true, BF16: true}, 0.2})
			}
			for _, run := range runs {
				es := openGPUs(t, cfg, run.opt, 20, run.gpus) // several chunks per block pass
				got, err := LinearKLSharded(es, m, seqs, noisy(0.2), run.mem, nil)
				if err != nil {
					t.Fatal(err)
				}
				mem := fmt.Sprintf("%d GPUs, memory %d, %+v", run.gpus, run.mem, run.opt)
				if len(got) != len(want) {
					t.Fatalf("%d probes on the GPU, %d on the CPU", len(got), len(want))
				}
				for name, w := range want {
					// 1e-8 absolute: float32 logits carry a KL of a few 1e-7 to about 1e-9 (an expert's
					// down_proj at 7.2e-7 differed by 2.1e-9 from the CPU's, every GPU run alike).
					if g := got[name]; !(math.Abs(g-w) <= run.tol*w+1e-8) {
						t.Errorf("%s: %s: GPU KL %g, CPU %g", mem, name, g, w)
					}
				}
			}
		})
	}
}

// TestGPUFusedAttention: with scaled FP16 and a head size of 64 or 128, attention runs in the
// fused kernel (flash_attention_d*); on fresh random models (GQA, a sliding window shorter than
// the sequence, sequences of 150 tokens: two whole tiles of 64 queries and a part) its logits
// stay within three times the TF32 forward's error of the CPU's float32 ones and within 3e-3 of the
// banded path's with the same FP16 linears, and so does a perplexity over several sequences.
func TestGPUFusedAttention(t *testing.T) {
	for _, tc := range []struct{ name, json string }{
		{"d128-gqa", `{"model_type": "llama", "hidden_size": 256, "intermediate_size": 320, "num_hidden_layers": 2,
			"num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 301}`},
		{"d64-window", `{"model_type": "mistral", "hidden_size": 192, "intermediate_size": 256, "num_hidden_layers": 2,
			"num_attention_heads": 3, "num_key_value_heads": 3, "vocab_size": 97, "sliding_window": 70}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.json)
			r := freshRand(t)
			m := randomModel(t, cfg, false, r)
			ids := randomIDs(r, 150, cfg.Vocab)
			want, err := m.Logits(ids)
			if err != nil {
				t.Fatal(err)
			}
			logits := func(opt GPUOptions, fused bool) []float32 {
				e := openGPU(t, cfg, opt, 0)
				if e.fused != (opt.F16) {
					t.Fatalf("fused attention %v with %+v", e.fused, opt)
				}
				e.fused = fused
				got, err := e.Logits(m, ids)
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			f16 := GPUOptions{TF32: true, F16: true}
			tf32, banded, fused := logits(GPUOptions{TF32: true}, false), logits(f16, false), logits(f16, true)
			errTF32, errFused, apart := relL2(tf32, want), relL2(fused, want), relL2(fused, banded)
			t.Logf("logits' relative error: TF32 %.2e, FP16 fused %.2e; fused against banded %.2e", errTF32, errFused, apart)
			if !(errFused < 3*errTF32) || !(apart < 3e-3) {
				t.Errorf("want the fused error under 3 × TF32's and within 3e-3 of the banded path's")
			}
			seqs := randomIDs(r, 3*100, cfg.Vocab)
			nll := func(fused bool) float64 {
				e := openGPU(t, cfg, f16, 0)
				e.fused = fused
				p, err := e.Perplexity(m, seqs, 100, 0)
				if err != nil {
					t.Fatal(err)
				}
				return p.MeanNLL
			}
			if a, b := nll(true), nll(false); math.Abs(a-b) > 1e-3*b {
				t.Errorf("mean NLL over 3 sequences: fused %.6f, banded %.6f", a, b)
			}
		})
	}
}

// TestGPUFusedAttentionLong compares the fused kernel with the scores' path on sequences of
// many tiles (T not a multiple of the 64-query tile), where most key tiles need no mask, the
// tiles' copies run ahead of the products over many steps and the query tiles run last first:
// head size 128 with grouped keys and values, 64 with a sliding window.
func TestGPUFusedAttentionLong(t *testing.T) {
	for _, tc := range []struct {
		name, json   string
		S, T, window int
	}{
		{"d128-gqa", `{"model_type": "llama", "hidden_size": 512, "intermediate_size": 64, "num_hidden_layers": 1,
			"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32}`, 2, 1000, 0},
		{"d64-window", `{"model_type": "llama", "hidden_size": 192, "intermediate_size": 64, "num_hidden_layers": 1,
			"num_attention_heads": 3, "num_key_value_heads": 3, "vocab_size": 32}`, 2, 700, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.json)
			e := openGPU(t, cfg, GPUOptions{TF32: true, F16: true}, 0)
			r := freshRand(t)
			inputs := make([][]float32, 3) // q [S, H, T, D]; k and v [S, KV, T, D]
			for i, heads := range []int{cfg.Heads, cfg.KVHeads, cfg.KVHeads} {
				inputs[i] = make([]float32, tc.S*heads*tc.T*cfg.HeadDim)
				for j := range inputs[i] {
					inputs[i][j] = float32(r.NormFloat64()) * 1.5
				}
			}
			attention := func(attend func(qh, kh, vh cuda.DevicePtr, S, T, window int) error) []float32 {
				var bufs [3]cuda.DevicePtr
				for i, v := range inputs {
					var err error
					if bufs[i], err = e.floats(fmt.Sprint("test.attention.", i), len(v)); err == nil {
						err = e.upload(bufs[i], cuda.Bytes(v))
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				if err := attend(bufs[0], bufs[1], bufs[2], tc.S, tc.T, tc.window); err != nil {
					t.Fatal(err)
				}
				out := make([]float32, len(inputs[0]))
				if err := e.Download(cuda.Bytes(out), bufs[0]); err != nil {
					t.Fatal(err)
				}
				return out
			}
			fused, banded := attention(e.flashAttention), attention(e.bandedAttention)
			if i := slices.IndexFunc(fused, func(v float32) bool { return math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) }); i >= 0 {
				t.Fatalf("fused output %d is %v", i, fused[i])
			}
			apart := relL2(fused, banded)
			t.Logf("%d × %d tokens, %d heads of %d (%d key/value), window %d: fused against the scores' path %.2e",
				tc.S, tc.T, cfg.Heads, cfg.HeadDim, cfg.KVHeads, tc.window, apart)
			if !(apart < 3e-3) {
				t.Errorf("fused attention %.2e from the scores' path, want under 3e-3", apart)
			}
		})
	}
}

// uploadFirstBlock uploads m's first block to e, freed when the test ends.
func uploadFirstBlock(tb testing.TB, e *GPU, m *Model) (*Block, *gpuBlock) {
	tb.Helper()
	b, err := m.Block(0)
	if err != nil {
		tb.Fatal(err)
	}
	g, err := e.uploadBlock(b)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.freeBlock(g) })
	return b, g
}

// relL2 is ‖got − want‖ / ‖want‖.
func relL2(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i] - want[i])
		num, den = num+d*d, den+float64(want[i])*float64(want[i])
	}
	return math.Sqrt(num / den)
}
