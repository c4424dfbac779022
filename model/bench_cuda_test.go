package model

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
)

// BenchmarkGPUEvalSmallLlama: the perplexity protocol (64×512 held-out tokens) on the GPU,
// float32 GEMMs; reports tokens/s.
func BenchmarkGPUEvalSmallLlama(b *testing.B) {
	m := openBF16Reference(b, smallLlamaDir)
	e := openGPU(b, m.Config, GPUOptions{}, 0)
	e.poison = false
	ids := heldoutIDs(b, smallLlamaDir)
	if _, err := e.Perplexity(m, ids, 512, 64); err != nil { // warm-up: uploads, JIT, buffers
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := e.Perplexity(m, ids, 512, 64); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*64*512)/b.Elapsed().Seconds(), "tokens/s")
}

// llama7BBlock is one decoder block of Llama-2-7B's shape with random weights.
func llama7BBlock(b *testing.B) (*Config, *Model) {
	cfg, err := ParseConfig([]byte(`{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
		"num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000}`))
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	w := NewMapWeights()
	set := func(name string, scale float32, shape ...int) {
		d := make([]float32, product(shape))
		for i := range d {
			d[i] = (2*r.Float32() - 1) * scale
		}
		w.Set(name, d, shape...)
	}
	h, in := cfg.Hidden, cfg.Intermediate
	set("model.embed_tokens.weight", 1, cfg.Vocab, h)
	set("model.norm.weight", 1, h)
	set("lm_head.weight", 0.02, cfg.Vocab, h)
	p := "model.layers.0."
	set(p+"input_layernorm.weight", 1, h)
	set(p+"post_attention_layernorm.weight", 1, h)
	for _, l := range []struct {
		name    string
		out, in int
	}{{"self_attn.q_proj", h, h}, {"self_attn.k_proj", h, h}, {"self_attn.v_proj", h, h}, {"self_attn.o_proj", h, h},
		{"mlp.gate_proj", in, h}, {"mlp.up_proj", in, h}, {"mlp.down_proj", h, in}} {
		set(p+l.name+".weight", 0.02, l.out, l.in)
	}
	m, err := Load(cfg, w)
	if err != nil {
		b.Fatal(err)
	}
	return cfg, m
}

// BenchmarkGPUForward7B times a Llama-2-7B block's forward pass over 4 × 2048 tokens on the GPU
// with TF32 GEMMs and with scaled FP16 (GPUOptions.F16: the conversions of the activations
// included), in TFLOP/s of the block's linears and attention products, against cuBLAS's rate
// on the block's largest GEMM shape in the same math, same run (the FP16 one on operands
// already converted).
func BenchmarkGPUForward7B(b *testing.B) {
	for _, c := range []struct {
		name string
		opt  GPUOptions
	}{{"tf32", GPUOptions{TF32: true}}, {"fp16", GPUOptions{TF32: true, F16: true}}} {
		b.Run(c.name, func(b *testing.B) { benchmarkForward7B(b, c.name, c.opt) })
	}
}

func benchmarkForward7B(b *testing.B, name string, opt GPUOptions) {
	cfg, m := llama7BBlock(b)
	e := openGPU(b, cfg, opt, 0)
	e.poison = false
	const S, T = 4, 2048
	seqs := make([][]int, S)
	r := rand.New(rand.NewPCG(2, 2))
	for i := range seqs {
		seqs[i] = randomIDs(r, T, cfg.Vocab)
	}
	x, err := e.Embed(m, seqs)
	if err != nil {
		b.Fatal(err)
	}
	defer x.Free()
	_, g := uploadFirstBlock(b, e, m)
	h, in, rows := cfg.Hidden, cfg.Intermediate, S*T
	flops := 2*float64(rows)*float64(4*h*h+3*h*in) + 2*2*float64(S*cfg.Heads)*T*T*float64(cfg.HeadDim)

	gemm := gemmRate(b, e, rows, in, h)
	rate := timedRate(b, e, flops, func() error { return e.forwardBlock(g, x, nil) }, gemm)
	free, total, _ := e.dev.MemoryInfo()
	b.Logf("7B block forward, %d×%d tokens, %s: %.1f TFLOP/s, cuBLAS GEMM %d×%d×%d: %.1f TFLOP/s, ratio %.2f; device memory in use %.2f GB",
		S, T, name, rate/1e12, rows, in, h, gemm/1e12, rate/gemm, float64(total-free)/1e9)
}

// BenchmarkGPULinear7B times each of a 7B block's linear shapes as the forward pass runs it
// (linear: the activations' scan and conversion to scaled FP16, then cuBLAS), 8192 rows, against
// cuBLAS alone on operands converted beforehand, same shape, same run.
func BenchmarkGPULinear7B(b *testing.B) {
	cfg, m := llama7BBlock(b)
	e := openGPU(b, cfg, GPUOptions{TF32: true, F16: true}, 0)
	e.poison = false
	_, g := uploadFirstBlock(b, e, m)
	const rows = 8192
	for _, l := range []*gpuLinear{g.q, g.gate, g.down} {
		b.Run(fmt.Sprintf("%dx%d", l.out, l.in), func(b *testing.B) {
			x, err := e.floats("bench.linear.x", rows*l.in)
			if err == nil {
				err = e.dev.Fill32(x, 0x3c23d70a, rows*l.in)
			}
			y, err2 := e.floats("bench.linear.y", rows*l.out)
			if err != nil || err2 != nil {
				b.Fatal(err, err2)
			}
			gemm := gemmRate(b, e, rows, l.out, l.in)
			rate := timedRate(b, e, 2*float64(rows)*float64(l.out)*float64(l.in), func() error { return e.linear(y, x, l, rows) }, gemm)
			b.Logf("%s %d×%d×%d: %.1f TFLOP/s with the conversion, cuBLAS alone %.1f TFLOP/s: %.2f", l.name, rows, l.out, l.in, rate/1e12, gemm/1e12, rate/gemm)
		})
	}
}

// BenchmarkGPUAttention7B times a 7B block's attention products and softmax on 4 × 2048 tokens
// (32 heads of 128), fused (flashAttention, its FP16 conversions included) and through the
// scores (bandedAttention, TF32), counting the causal half's FLOPs, 4·S·H·T²·D/2.
func BenchmarkGPUAttention7B(b *testing.B) {
	cfg, _ := llama7BBlock(b)
	e := openGPU(b, cfg, GPUOptions{TF32: true, F16: true}, 0)
	e.poison = false
	const S, T = 4, 2048
	n := S * cfg.Heads * T * cfg.HeadDim
	var bufs [3]cuda.DevicePtr
	for i := range bufs {
		var err error
		if bufs[i], err = e.floats("bench.attention."+strconv.Itoa(i), n); err != nil {
			b.Fatal(err)
		}
		if err := e.dev.Fill32(bufs[i], 0x3c23d70a+uint32(i), n); err != nil {
			b.Fatal(err)
		}
	}
	flops := 4 * float64(S*cfg.Heads) * T * T * float64(cfg.HeadDim) / 2
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"fused", func() error { return e.flashAttention(bufs[0], bufs[1], bufs[2], S, T, 0) }},
		{"banded", func() error { return e.bandedAttention(bufs[0], bufs[1], bufs[2], S, T, 0) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			tm, err := e.dev.TimeOnStream(e.stream, 2, 10, 0, c.run)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(tm.Median.Seconds()*1e3, "ms")
			b.ReportMetric(flops/tm.Median.Seconds()/1e12, "TFLOP/s")
			b.Logf("attention %s, %d×%d tokens, %d heads of %d: %.2f ms, %.1f TFLOP/s", c.name, S, T, cfg.Heads, cfg.HeadDim,
				tm.Median.Seconds()*1e3, flops/tm.Median.Seconds()/1e12)
		})
	}
}

// BenchmarkGPUGram7B times AddGram (the upper tiles, then FinishGram's mirror once per 8 chunks)
// on 8192-row chunks of a 7B's two Gram widths, TF32 and scaled FP16 (the conversion included),
// counting the whole product's 2·rows·cols² FLOPs, against cuBLAS's whole xᵀx in the same math,
// same run (FP16 on operands already converted): a ratio above 1 is the half that is skipped.
func BenchmarkGPUGram7B(b *testing.B) {
	for _, c := range []struct {
		name string
		opt  GPUOptions
	}{{"tf32", GPUOptions{TF32: true}}, {"fp16", GPUOptions{TF32: true, F16: true}}} {
		for _, cols := range []int{4096, 11008} {
			b.Run(fmt.Sprintf("%s/%d", c.name, cols), func(b *testing.B) { benchmarkGram(b, c.name, c.opt, cols) })
		}
	}
}

func benchmarkGram(b *testing.B, name string, opt GPUOptions, cols int) {
	e := openGPU(b, mustConfig(b, gpuTestConfigs[0].json), opt, 0)
	e.poison = false
	const rows, chunks = 8192, 8
	x, err := e.floats("bench.x", rows*cols)
	if err != nil {
		b.Fatal(err)
	}
	sum, err := e.floats("bench.sum", cols*cols)
	if err != nil {
		b.Fatal(err)
	}
	if err := e.dev.Fill32(x, 0x3c23d70a, rows*cols); err != nil { // 0.01: not zeros
		b.Fatal(err)
	}
	run := func() error {
		for range chunks {
			if err := e.AddGram(sum, x, rows, cols); err != nil {
				return err
			}
		}
		return e.FinishGram(sum, cols)
	}
	whole := gramRate(b, e, x, sum, rows, cols)
	rate := timedRate(b, e, 2*float64(rows)*float64(cols)*float64(cols)*chunks, run, whole)
	b.Logf("Gram %d×%d, %s: %.1f TFLOP/s of the whole product, cuBLAS's whole xᵀx %.1f TFLOP/s, ratio %.2f", rows, cols, name, rate/1e12, whole/1e12, rate/whole)
}

// timedRate runs op once to warm up, then b.N times, each waited for, and reports its rate of
// flops a run against cuBLAS's rate gemm (FLOP/s); it returns the rate.
func timedRate(b *testing.B, e *GPU, flops float64, op func() error, gemm float64) float64 {
	run := func() {
		if err := op(); err != nil {
			b.Fatal(err)
		}
		if err := e.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	run()
	b.ResetTimer()
	for range b.N {
		run()
	}
	rate := flops * float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(rate/1e12, "TFLOP/s")
	b.ReportMetric(gemm/1e12, "cuBLAS-TFLOP/s")
	b.ReportMetric(rate/gemm, "ratio")
	return rate
}

// gramRate times one cuBLAS GEMM sum += xᵀx over the whole [cols, cols] in the engine's math
// (scaled FP16 on x converted beforehand), median of 10, in FLOP/s.
func gramRate(b *testing.B, e *GPU, x, sum cuda.DevicePtr, rows, cols int) float64 {
	op := func() error {
		return e.blas.Sgemm(cuda.NoTrans, cuda.Trans, cols, cols, rows, 1, x, cols, x, cols, 1, sum, cols)
	}
	if e.grams == halfF16 {
		xh, err := e.half(e.grams, "bench.xh", x, rows*cols, 0)
		if err != nil {
			b.Fatal(err)
		}
		op = func() error {
			return e.blas.GemmF16(cuda.NoTrans, cuda.Trans, cols, cols, rows, e.scalar(f16Alpha), xh, cols, xh, cols, e.scalar(f16One), sum, cols)
		}
	}
	tm, err := e.dev.TimeOnStream(e.stream, 2, 10, 0, op)
	if err != nil {
		b.Fatal(err)
	}
	return 2 * float64(rows) * float64(cols) * float64(cols) / tm.Median.Seconds()
}

// gemmRate times the engine's cuBLAS (its math mode; scaled FP16 on operands converted
// beforehand) on y[m, n] = x[m, k]·Wᵀ, median of 20, in FLOP/s.
func gemmRate(b *testing.B, e *GPU, m, n, k int) float64 {
	bufs := make([]cuda.DevicePtr, 3)
	for i, size := range []int{m * k, n * k, m * n} {
		var err error
		if bufs[i], err = e.floats("bench."+strconv.Itoa(i), size); err != nil {
			b.Fatal(err)
		}
		if err := e.dev.Fill32(bufs[i], 0x3c23d70a, size); err != nil { // 0.01: not zeros
			b.Fatal(err)
		}
	}
	l := &gpuLinear{name: "bench", out: n, in: k, w: bufs[1]}
	op := func() error { return e.linear(bufs[2], bufs[0], l, m) }
	if e.linears == halfF16 { // cuBLAS alone: both operands converted beforehand
		wh, err := e.half(e.linears, "bench.wh", bufs[1], n*k, 0)
		if err != nil {
			b.Fatal(err)
		}
		xh, err := e.half(e.linears, "bench.xh", bufs[0], m*k, e.scalar(f16Shift))
		if err != nil {
			b.Fatal(err)
		}
		op = func() error {
			return e.blas.GemmF16(cuda.Trans, cuda.NoTrans, n, m, k, e.scalar(f16Alpha), wh, k, xh, k, e.scalar(f16Zero), bufs[2], n)
		}
	}
	tm, err := e.dev.TimeOnStream(e.stream, 3, 20, 0, op)
	if err != nil {
		b.Fatal(err)
	}
	return 2 * float64(m) * float64(n) * float64(k) / tm.Median.Seconds()
}
