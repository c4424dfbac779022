//go:build !amd64 || purego

package kquant

const hasAVX2 = false

func scaleMin8AVX2(s *scaleMin8) { panic("kquant: no AVX2 kernel on this architecture") }
