//go:build !purego

package gguf

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasBMI1 // TZCNT finds the largest magnitude

// q4_0AVX2 quantizes blocks whole blocks of x to Q4_0: scales to d, codes to qs at a stride of
// 18 bytes (each block's two scale bytes are left to the caller).
//
//go:noescape
func q4_0AVX2(qs *byte, d *float32, x *float32, blocks int)
