//go:build !purego

package kquant

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2

//go:noescape
func scaleMin8AVX2(s *scaleMin8)
