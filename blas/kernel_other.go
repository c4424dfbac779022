//go:build !amd64 || purego

package blas

// simdKernels: no assembly kernel for this architecture (or the purego build tag is set).
func simdKernels() []*kernel { return nil }
