// Package blas runs single-precision matrix products through OpenBLAS when its library is
// present, and says when it is not.
//
// The library is opened at run time through purego (no cgo), so one static binary runs with or
// without it: callers ask Available, or call SgemmNT and fall back to their own pure-Go code when
// it returns false. The names tried, in order: $QPACK_OPENBLAS when set, libopenblas.so.0,
// libopenblas.so, Debian's openblas-pthread/libopenblas.so.0, then libblas.so.3 if it exports
// cblas_sgemm (the reference BLAS does not). QPACK_BLAS=go disables the library, forcing
// callers onto their pure-Go paths. OpenBLAS picks its thread count itself (OPENBLAS_NUM_THREADS
// overrides it).
package blas
