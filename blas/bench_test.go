package blas

import (
	"math/rand/v2"
	"testing"
)

func benchSgemmNT(b *testing.B, m, n, k int) {
	requireBLAS(b)
	r := rand.New(rand.NewPCG(3, 4))
	x, w, y := randomMatrix(r, m*k), randomMatrix(r, n*k), make([]float32, m*n)
	for b.Loop() {
		SgemmNT(m, n, k, x, k, w, k, y, n)
	}
	b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// Sizes as model's BenchmarkMatMul (rows×in×out) and a Llama-7B-sized layer over 2048 tokens.
func BenchmarkSgemmNT512x384x1024(b *testing.B)   { benchSgemmNT(b, 512, 1024, 384) }
func BenchmarkSgemmNT2048x4096x4096(b *testing.B) { benchSgemmNT(b, 2048, 4096, 4096) }
