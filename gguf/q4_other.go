//go:build !amd64 || purego

package gguf

const hasAVX2 = false

func q4_0AVX2(qs *byte, d *float32, x *float32, blocks int) { panic("gguf: no AVX2 kernel") }
