//go:build !purego

package vec

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// expAVX2 is Exp on n values, n a positive multiple of 8.
//
//go:noescape
func expAVX2(dst, src *float32, n int)
