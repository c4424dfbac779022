package model

import (
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

// BenchmarkGPUForward7B: one Llama-2-7B-shaped block over 4 sequences of 2048 tokens (one
// chunk, 8192 rows) with TF32 GEMMs, against cuBLAS's TF32 rate on the block's largest GEMM
// (8192×11008×4096) measured in the same run. FLOPs count the seven linears and both attention
// products over the full T×T square (what is computed; causal masking wastes half).
func BenchmarkGPUForward7B(b *testing.B) {
	cfg, m := llama7BBlock(b)
	e := openGPU(b, cfg, GPUOptions{TF32: true}, 0)
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
	blk, err := m.Block(0)
	if err != nil {
		b.Fatal(err)
	}
	g, err := e.uploadBlock(blk)
	if err != nil {
		b.Fatal(err)
	}
	defer e.freeBlock(g)
	h, in, rows := cfg.Hidden, cfg.Intermediate, S*T
	flops := 2*float64(rows)*float64(4*h*h+3*h*in) + 2*2*float64(S*cfg.Heads)*T*T*float64(cfg.HeadDim)

	gemm := gemmRate(b, e, rows, in, h)
	run := func() {
		if err := e.forwardBlock(g, x, nil); err != nil {
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
	free, total, _ := e.dev.MemoryInfo()
	b.Logf("7B block forward, %d×%d tokens, TF32: %.1f TFLOP/s, cuBLAS TF32 GEMM %d×%d×%d: %.1f TFLOP/s, ratio %.2f; device memory in use %.2f GB",
		S, T, rate/1e12, rows, in, h, gemm/1e12, rate/gemm, float64(total-free)/1e9)
}

// gemmRate times the engine's cuBLAS (its math mode) on y[m, n] = x[m, k]·Wᵀ, median of 20,
// in FLOP/s.
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
	tm, err := e.dev.TimeOnStream(e.stream, 3, 20, 0, func() error { return e.linear(bufs[2], bufs[0], l, m) })
	if err != nil {
		b.Fatal(err)
	}
	return 2 * float64(m) * float64(n) * float64(k) / tm.Median.Seconds()
}
