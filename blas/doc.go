// Package blas computes dense single-precision matrix products on the CPU, fast without any
// system library: its own Go engine with assembly micro-kernels, or OpenBLAS where that is the
// better choice.
//
// The Go engine is the GotoBLAS scheme: operands packed into panels, blocked for the caches,
// the blocks spread over all cores, and a micro-kernel that keeps a tile of C in registers. The
// kernels are AVX-512 (14×32 tiles) and AVX2+FMA (6×16) in Go assembly, picked at run time
// with golang.org/x/sys/cpu, and a portable Go one (4×4) for every other CPU (or the purego
// build tag). The SIMD kernels sum each output in step order with fused multiply-adds, so they
// give the same bits, on one core or many.
//
// OpenBLAS is opened at run time through purego (no cgo), so one static binary runs with or
// without it. The names tried, in order: $QPACK_OPENBLAS when set, libopenblas.so.0,
// libopenblas.so, Debian's openblas-pthread/libopenblas.so.0, then libblas.so.3 if it exports
// cblas_sgemm (the reference BLAS does not). Sgemm uses it only when the CPU has no SIMD kernel
// (see choose) or QPACK_BLAS=openblas asks for it; QPACK_BLAS=go keeps the Go engine.
// Current says which path this process takes and why.
package blas
