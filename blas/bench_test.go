package blas

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU time this process has used: on a machine shared with other work, GFLOP per
// CPU-second measures a kernel where wall time measures the neighbours.
func cpuTime() time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		return 0
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// loop runs body b.N times and reports GFLOP/s of wall time and GFLOP per CPU-second.
func loop(b *testing.B, flops float64, body func()) {
	cpu0 := cpuTime()
	for b.Loop() {
		body()
	}
	b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	b.ReportMetric(flops*float64(b.N)/(cpuTime()-cpu0).Seconds()/1e9, "GFLOP/cpu-s")
}

// benchShapes are the products that matter here, as m×n×k of C = A·Bᵀ: small-llama's linears over
// one sequence of 512 tokens (q/k/v/o, gate/up, down, lm_head) and a Llama-7B layer over 2048
// tokens.
var benchShapes = [][3]int{{512, 384, 384}, {512, 1024, 384}, {512, 384, 1024}, {512, 4096, 384}, {2048, 4096, 4096}}

// BenchmarkSgemmNT compares, on the same data in the same run, every Go kernel on all cores and
// OpenBLAS (when it loads: QPACK_OPENBLAS names it) on the shapes of benchShapes.
func BenchmarkSgemmNT(b *testing.B) {
	for _, s := range benchShapes {
		m, n, k := s[0], s[1], s[2]
		r := rand.New(rand.NewPCG(3, 4))
		x, w, y := randomMatrix(r, m*k), randomMatrix(r, n*k), make([]float32, m*n)
		flops := 2 * float64(m*n*k)
		for _, kern := range kernels() {
			b.Run(fmt.Sprintf("%dx%dx%d/%s", m, n, k, kern.name), func(b *testing.B) {
				o := &operands{tA: NoTrans, tB: Trans, m: m, n: n, k: k, alpha: 1, a: x, lda: k, b: w, ldb: k}
				loop(b, flops, func() { gemmGo(kern, Threads(), o, 0, y, n) })
			})
		}
		b.Run(fmt.Sprintf("%dx%dx%d/openblas", m, n, k), func(b *testing.B) {
			lib, err := openBLAS()
			if err != nil {
				b.Skip(err)
			}
			loop(b, flops, func() { lib.gemm(NoTrans, Trans, m, n, k, 1, x, k, w, k, 0, y, n) })
		})
	}
}

// BenchmarkKernel runs each micro-kernel alone on panels that stay in L1, on one core: the
// ceiling the blocked product can approach.
func BenchmarkKernel(b *testing.B) {
	for _, kern := range kernels() {
		b.Run(kern.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(5, 6))
			const kc = 128
			a, p, c := randomMatrix(r, kc*kern.mr), randomMatrix(r, kc*kern.nr), make([]float32, kern.mr*kern.nr)
			loop(b, 2*float64(kc*kern.mr*kern.nr), func() { kern.run(kc, a, p, c, kern.nr, true) })
		})
	}
}

// BenchmarkSyrkT64 is the GPTQ Hessian update of one sequence of 512 tokens for inputs of width
// 384 and 1024 (small-llama) and 4096 (7B).
func BenchmarkSyrkT64(b *testing.B) {
	for _, n := range []int{384, 1024, 4096} {
		const k = 512
		r := rand.New(rand.NewPCG(7, 8))
		x, c := randomMatrix(r, k*n), make([]float64, n*n)
		b.Run(fmt.Sprintf("%dx%d", n, k), func(b *testing.B) {
			loop(b, float64(n*n*k), func() { SyrkT64(n, k, 1, x, n, 1, c, n) })
		})
	}
}
