//go:build !purego

package vec

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// The kernels take n, a positive multiple of 8.

//go:noescape
func expSumAVX2(dst, src *float32, n int, shift float32) float64

//go:noescape
func maxAVX2(x *float32, n int) float32

//go:noescape
func scaleAVX2(x *float32, n int, a float32)
