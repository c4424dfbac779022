//go:build !amd64 || purego

package packing

const hasAVX2 = false

func packGPTQ4x8AVX2(dst *byte, codes *byte, k, n, blocks int) (bad uint64) {
	panic("packing: no AVX2 kernel")
}
