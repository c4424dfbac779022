package gptq

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// kmsHessian returns a positive definite k×k Hessian cheaply: H_ij = s_i·s_j·ρ^|i−j|
// (Kac–Murdock–Szegő correlations) with a few channels 20× larger.
func kmsHessian(k int) []float64 {
	s := make([]float64, k)
	for i := range s {
		s[i] = 1 + 0.5*math.Sin(float64(i))
		if i%97 == 5 {
			s[i] *= 20
		}
	}
	h := make([]float64, k*k)
	for i := range k {
		for j := range k {
			h[i*k+j] = s[i] * s[j] * math.Pow(0.9, math.Abs(float64(i-j)))
		}
	}
	return h
}

// BenchmarkQuantize: the quantization step of one layer given its Hessian (int4-g128-sym).
func BenchmarkQuantize(b *testing.B) {
	for _, shape := range [][2]int{{4096, 4096}, {4096, 11008}} {
		n, k := shape[0], shape[1]
		b.Run(fmt.Sprintf("%dx%d", n, k), func(b *testing.B) {
			w := randomWeights(rand.New(rand.NewPCG(1, 1)), n, k)
			h := kmsHessian(k)
			opt := Options{Work: new(Workspace)}
			s := quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}
			b.ResetTimer()
			for b.Loop() {
				_, st, err := Quantize(w, n, k, h, s, opt)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(st.Factor.Seconds(), "factor-s")
			}
		})
	}
}

// BenchmarkHessianAdd: one batch of 512 tokens of width 4096 (a 128×512-token calibration set
// is 128 such batches).
func BenchmarkHessianAdd(b *testing.B) {
	const rows, k = 512, 4096
	x := correlatedActivations(rand.New(rand.NewPCG(2, 2)), rows, k)
	h := NewHessian(k)
	b.ResetTimer()
	for b.Loop() {
		if err := h.Add(x, rows, k); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows)*k*k/b.Elapsed().Seconds()*float64(b.N)/1e9, "GMAC/s")
}

// BenchmarkHessianAddExpert: the batches of a fine-grained mixture of experts, each expert's
// share of one 2048-token sequence (Qwen3-30B-A3B: width 2048, 128 experts, top 8, so 128 rows
// each on average), then H read once, as GPTQ does after the last sequence.
func BenchmarkHessianAddExpert(b *testing.B) {
	const rows, k, batches = 128, 2048, 16
	x := correlatedActivations(rand.New(rand.NewPCG(3, 3)), rows, k)
	b.ResetTimer()
	for b.Loop() {
		h := NewHessian(k)
		for range batches {
			if err := h.Add(x, rows, k); err != nil {
				b.Fatal(err)
			}
		}
		h.Matrix()
	}
	b.ReportMetric(float64(batches*rows)*k*k/b.Elapsed().Seconds()*float64(b.N)/1e9, "GMAC/s")
}

// BenchmarkTrailingUpdate: one block's update of 1024 rows × 4096 later columns.
func BenchmarkTrailingUpdate(b *testing.B) {
	const n, k, bs = 1024, 4224, 128
	w := make([]float32, n*k)
	u := make([]float32, k*k)
	errs := make([]float32, n*bs)
	for i := range errs {
		errs[i] = 1e-3
	}
	b.ResetTimer()
	for b.Loop() {
		trailingUpdate(w, k, 0, n, errs, bs, u, 0, bs)
	}
	b.ReportMetric(float64(n)*bs*(k-bs)/b.Elapsed().Seconds()*float64(b.N)/1e9, "GMAC/s")
}
