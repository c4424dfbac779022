//go:build !purego

package blockwise

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2

//go:noescape
func bf16SpanAVX2(dst *float32, raw *byte, n int) (pos int32, neg uint32)

//go:noescape
func encodeIntAVX2(codes *uint8, ties *uint8, w *float32, n int, inv, zeroMagic float32, magicBits uint32, tieBits uint32, maxq int32)
