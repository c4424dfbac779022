//go:build !purego

package blockwise

import (
	"github.com/klauspost/cpuid/v2"
	"golang.org/x/sys/cpu"
)

var hasAVX2 = cpu.X86.HasAVX2

// hasRTNKernel: rtnIntGroupsAVX2 also rounds scales to F16 with F16C's conversion.
var hasRTNKernel = hasAVX2 && cpuid.CPU.Supports(cpuid.F16C)

//go:noescape
func bf16SpanAVX2(dst *float32, raw *byte, n int) (pos int32, neg uint32)

//go:noescape
func encodeIntAVX2(codes *uint8, ties *uint8, w *float32, n int, inv, zeroMagic float32, magicBits uint32, tieBits uint32, maxq int32)

//go:noescape
func rtnIntGroupsAVX2(codes *uint8, scales *float32, zeros *uint8, raw *byte, groups, gs int, maxq, symZero int32, maxqF float32)
