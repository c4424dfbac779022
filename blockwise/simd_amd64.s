//go:build !purego

#include "textflag.h"

// func bf16SpanAVX2(dst *float32, raw *byte, n int) (pos int32, neg uint32)
//
// Converts n BF16 values (n a positive multiple of 8) to float32 and returns the largest of
// their bits as signed integers (at least 0) and as unsigned integers (at least 0x80000000):
// bf16Rows.spanned's two maxima.
TEXT ·bf16SpanAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ raw+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	VPXOR Y1, Y1, Y1          // signed maxima: +0
	VPCMPEQD Y2, Y2, Y2
	VPSLLD $31, Y2, Y2        // unsigned maxima: −0
loop:
	VPMOVZXWD (SI), Y0
	VPSLLD  $16, Y0, Y0
	VMOVDQU Y0, (DI)
	VPMAXSD Y0, Y1, Y1
	VPMAXUD Y0, Y2, Y2
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  loop
	VEXTRACTI128 $1, Y1, X3
	VPMAXSD X3, X1, X1
	VPSHUFD $0x4e, X1, X3
	VPMAXSD X3, X1, X1
	VPSHUFD $0xb1, X1, X3
	VPMAXSD X3, X1, X1
	VMOVD   X1, AX
	MOVL    AX, pos+24(FP)
	VEXTRACTI128 $1, Y2, X3
	VPMAXUD X3, X2, X2
	VPSHUFD $0x4e, X2, X3
	VPMAXUD X3, X2, X2
	VPSHUFD $0xb1, X2, X3
	VPMAXUD X3, X2, X2
	VMOVD   X2, AX
	MOVL    AX, neg+28(FP)
	VZEROUPPER
	RET

// func encodeIntAVX2(codes *uint8, ties *uint8, w *float32, n int, inv, zeroMagic float32, magicBits uint32, tieBits uint32, maxq int32)
//
// intQuantizer.encode's fast path on n weights (a positive multiple of 8), eight at a time:
// x = w·inv, y = x + zeroMagic, code = bits(y) − magicBits clamped to [0, maxq]; ties[j] gets
// the lanes of chunk j whose |x − (y − zeroMagic)| bits exceed tieBits, for the caller to redo.
TEXT ·encodeIntAVX2(SB), NOSPLIT, $0-52
	MOVQ codes+0(FP), DI
	MOVQ ties+8(FP), DX
	MOVQ w+16(FP), SI
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	VBROADCASTSS inv+32(FP), Y8
	VBROADCASTSS zeroMagic+36(FP), Y9
	MOVL    magicBits+40(FP), AX
	VMOVD   AX, X10
	VPBROADCASTD X10, Y10
	MOVL    tieBits+44(FP), AX
	VMOVD   AX, X11
	VPBROADCASTD X11, Y11
	MOVL    maxq+48(FP), AX
	VMOVD   AX, X12
	VPBROADCASTD X12, Y12
	VPXOR   Y13, Y13, Y13
	VPCMPEQD Y14, Y14, Y14
	VPSRLD  $1, Y14, Y14      // 0x7fffffff
loop:
	VMULPS  (SI), Y8, Y0      // x
	VADDPS  Y9, Y0, Y1        // y
	VSUBPS  Y9, Y1, Y2        // r
	VPSUBD  Y10, Y1, Y1       // code
	VSUBPS  Y2, Y0, Y2        // x − r
	VPAND   Y14, Y2, Y2
	VPCMPGTD Y11, Y2, Y2      // near a tie
	VMOVMSKPS Y2, AX
	MOVB    AX, (DX)
	VPMAXSD Y13, Y1, Y1
	VPMINSD Y12, Y1, Y1
	VEXTRACTI128 $1, Y1, X3
	VPACKUSDW X3, X1, X1
	VPACKUSWB X1, X1, X1
	VMOVQ   X1, (DI)
	ADDQ $32, SI
	ADDQ $8, DI
	INCQ DX
	DECQ CX
	JNZ  loop
	VZEROUPPER
	RET
