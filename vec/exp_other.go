//go:build !amd64 || purego

package vec

const hasAVX2 = false

func expAVX2(dst, src *float32, n int) { panic("vec: no AVX2 kernel on this architecture") }
