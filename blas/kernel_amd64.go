//go:build !purego

package blas

import "golang.org/x/sys/cpu"

//go:noescape
func kernel14x32(kc int, a, b, c *float32, ldc int, add int)

//go:noescape
func kernel6x16(kc int, a, b, c *float32, ldc int, add int)

// hasAVX2 says whether transpose8 and axpby64 run here.
var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// transpose8 sets dst[p·dstStride + r] = alpha·src[r·srcStride + p] for r, p < 8.
//
//go:noescape
func transpose8(dst *float32, dstStride int, src *float32, srcStride int, alpha float32)

// simdKernels are the assembly kernels this CPU can run, fastest first.
func simdKernels() []*kernel {
	var ks []*kernel
	if cpu.X86.HasAVX512F {
		ks = append(ks, &kernel{name: "avx512", mr: 14, nr: 32, kc: 256, mc: 252, nc: 4096, simd: true,
			run: asmKernel(14, 32, kernel14x32)})
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		ks = append(ks, &kernel{name: "avx2+fma", mr: 6, nr: 16, kc: 256, mc: 144, nc: 4096, simd: true,
			run: asmKernel(6, 16, kernel6x16)})
	}
	return ks
}

// asmKernel wraps an assembly kernel of an mr×nr tile, checking the slices it will read and
// write so that a wrong call panics in Go rather than corrupting memory.
func asmKernel(mr, nr int, f func(kc int, a, b, c *float32, ldc int, add int)) func(kc int, a, b, c []float32, ldc int, add bool) {
	return func(kc int, a, b, c []float32, ldc int, add bool) {
		if kc <= 0 || len(a) < kc*mr || len(b) < kc*nr || ldc < nr || len(c) < (mr-1)*ldc+nr {
			panic("blas: micro-kernel called with short panels")
		}
		flag := 0
		if add {
			flag = 1
		}
		f(kc, &a[0], &b[0], &c[0], ldc, flag)
	}
}

// axpby64 sets dst[j] = beta·dst[j] + alpha·src[j] for j < n.
//
//go:noescape
func axpby64(dst *float64, src *float32, n int, alpha, beta float64)
