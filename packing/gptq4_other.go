//go:build !amd64 || purego

package packing

// Without amd64 the kernel below is never called (callers check hasAVX2, constant false
// here): it exists so that the portable build links.
const hasAVX2 = false

func packGPTQ4x8AVX2(dst *byte, codes *byte, k, n, blocks int) (bad uint64) {
	panic("packing: no AVX2 kernel")
}
