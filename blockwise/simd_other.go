//go:build !amd64 || purego

package blockwise

// Without amd64 the kernels below are never called (callers check hasAVX2 and hasRTNKernel,
// constant false here): they exist so that the portable build links.
const hasAVX2 = false

func bf16SpanAVX2(dst *float32, raw *byte, n int) (pos int32, neg uint32) {
	panic("blockwise: no AVX2 kernel")
}

func encodeIntAVX2(codes *uint8, ties *uint8, w *float32, n int, inv, zeroMagic float32, magicBits uint32, tieBits uint32, maxq int32) {
	panic("blockwise: no AVX2 kernel")
}

const hasRTNKernel = false

func rtnIntGroupsAVX2(codes *uint8, scales *float32, zeros *uint8, raw *byte, groups, gs int, maxq, symZero int32, maxqF float32) {
	panic("blockwise: no AVX2 kernel")
}
