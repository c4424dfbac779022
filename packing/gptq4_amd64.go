//go:build !purego

package packing

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2

//go:noescape
func packGPTQ4x8AVX2(dst *byte, codes *byte, k, n, blocks int) (bad uint64)
