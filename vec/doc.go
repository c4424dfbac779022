// Package vec applies elementwise functions to float32 slices, with SIMD kernels where the CPU
// has them (AVX2+FMA, picked at run time) and plain Go otherwise, which is their reference.
package vec
