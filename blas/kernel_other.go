//go:build !amd64 || purego

package blas

// simdKernels: no assembly kernel for this architecture (or the purego build tag is set).
func simdKernels() []*kernel { return nil }

const hasAVX2 = false

func transpose8(dst *float32, dstStride int, src *float32, srcStride int, alpha float32) {
	panic("blas: no transpose8 on this architecture")
}

func axpby64(dst *float64, src *float32, n int, alpha, beta float64) {
	panic("blas: no axpby64 on this architecture")
}
