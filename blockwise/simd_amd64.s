//go:build !purego

#include "textflag.h"

// HMAX leaves in x's lane 0 the maximum (by op, VPMAXSD or VPMAXUD) of the eight lanes of y,
// which x names the low half of; X3 is scratch.
#define HMAX(op, y, x) \
	VEXTRACTI128 $1, y, X3; \
	op X3, x, x; \
	VPSHUFD $0x4e, x, X3; \
	op X3, x, x; \
	VPSHUFD $0xb1, x, X3; \
	op X3, x, x

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
	HMAX(VPMAXSD, Y1, X1)
	VMOVD   X1, AX
	MOVL    AX, pos+24(FP)
	HMAX(VPMAXUD, Y2, X2)
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

// func rtnIntGroupsAVX2(codes *uint8, scales *float32, zeros *uint8, raw *byte, groups, gs int, maxq, symZero int32, maxqF float32)
//
// Plain round-to-nearest of groups whole groups of gs BF16 weights each (gs a positive multiple
// of 8) on the integer grid, as intQuantizer.fit and encode do it: per group the span of
// [min(w, 0), max(w, 0)] (bf16SpanAVX2's two maxima), scale = F16((xmax − xmin)/maxq) rounded by
// the F16C conversion (nearest even, subnormals kept; 0 becomes the smallest subnormal), zero =
// symZero, or clamp(round(−xmin/scale), 0, maxq) when symZero is 0 (asymmetric), and codes
// clamp(round(clamp(w/scale, ±256)) + zero, 0, maxq) with the true division, rounded by
// VCVTPS2DQ (nearest even). A group with a NaN or infinity, or whose scale overflows F16, gets
// scale 0 and no codes, for the caller to redo.
TEXT ·rtnIntGroupsAVX2(SB), NOSPLIT, $0-60
	MOVQ codes+0(FP), DI
	MOVQ scales+8(FP), R9
	MOVQ zeros+16(FP), R10
	MOVQ raw+24(FP), SI
	MOVQ groups+32(FP), R12
	MOVQ gs+40(FP), R13
	SHRQ $3, R13              // chunks of 8 per group
	MOVL symZero+52(FP), R11
	VMOVSS maxqF+56(FP), X13
	MOVL maxq+48(FP), AX
	VMOVD AX, X12
	VPBROADCASTD X12, Y12     // maxq
	MOVL $0x43800000, AX      // 256.0
	VMOVD AX, X11
	VPBROADCASTD X11, Y11
	MOVL $0xc3800000, AX      // −256.0
	VMOVD AX, X10
	VPBROADCASTD X10, Y10
	VPXOR Y9, Y9, Y9          // 0
	MOVL $0x80000000, AX      // −0's bits
	VMOVD AX, X15
	VPBROADCASTD X15, Y15

group:
	VPXOR   Y1, Y1, Y1        // signed maxima: +0
	VMOVDQU Y15, Y2           // unsigned maxima: −0
	MOVQ SI, R8
	MOVQ R13, CX
span:
	VPMOVZXWD (R8), Y0
	VPSLLD  $16, Y0, Y0
	VPMAXSD Y0, Y1, Y1
	VPMAXUD Y0, Y2, Y2
	ADDQ $16, R8
	DECQ CX
	JNZ  span
	HMAX(VPMAXSD, Y1, X1)
	HMAX(VPMAXUD, Y2, X2)
	VMOVD X1, AX              // bits of max(w, 0)
	VMOVD X2, BX
	ANDL $0x7fffffff, BX      // bits of −min(w, 0)
	CMPL AX, $0x7f800000
	JAE  redo
	CMPL BX, $0x7f800000
	JAE  redo
	VMOVD BX, X2              // X2 = −xmin (asymmetric), X1 = max(w, 0)
	MOVL AX, DX
	ORL  BX, DX
	JNZ  nonzero
	MOVL $0x40000000, AX      // all zero: xmin, xmax = −1, 1
	VMOVD AX, X4
	MOVL $0x3f800000, AX
	VMOVD AX, X2
	JMP  scale
nonzero:
	TESTL R11, R11
	JZ    asym
	VMAXSS X2, X1, X4         // xmax = max(−min, max)
	TESTL BX, BX
	JZ    scale               // xmin = 0
	VADDSS X4, X4, X4         // xmax − (−xmax)
	JMP   scale
asym:
	VADDSS X2, X1, X4         // xmax − xmin
scale:
	VDIVSS X13, X4, X4
	VCVTPS2PH $0, X4, X4      // F16, nearest even
	VCVTPH2PS X4, X4
	VMOVD X4, AX
	TESTL AX, AX
	JNZ   scaled
	MOVL $0x33800000, AX      // the smallest F16 subnormal
	VMOVD AX, X4
scaled:
	CMPL AX, $0x7f800000
	JAE  redo
	VMOVSS X4, (R9)
	MOVL R11, DX
	TESTL DX, DX
	JNZ  zeroed
	VDIVSS X4, X2, X5         // −xmin/scale
	VROUNDSS $8, X5, X5, X5   // nearest even
	VMAXSS X9, X5, X5
	VMINSS X13, X5, X5
	VCVTTSS2SI X5, DX
zeroed:
	MOVB DX, (R10)
	VMOVD DX, X6
	VPBROADCASTD X6, Y6
	VBROADCASTSS X4, Y5
	MOVQ SI, R8
	MOVQ R13, CX
encode:
	VPMOVZXWD (R8), Y0
	VPSLLD  $16, Y0, Y0
	VDIVPS  Y5, Y0, Y0        // w/scale
	VMINPS  Y11, Y0, Y0
	VMAXPS  Y10, Y0, Y0
	VCVTPS2DQ Y0, Y0          // nearest even
	VPADDD  Y6, Y0, Y0
	VPMAXSD Y9, Y0, Y0
	VPMINSD Y12, Y0, Y0
	VEXTRACTI128 $1, Y0, X3
	VPACKUSDW X3, X0, X0
	VPACKUSWB X0, X0, X0
	VMOVQ   X0, (DI)
	ADDQ $16, R8
	ADDQ $8, DI
	DECQ CX
	JNZ  encode
	JMP  next
redo:
	MOVL $0, (R9)             // scale 0: the caller redoes the group
	LEAQ (DI)(R13*8), DI
next:
	MOVQ R8, SI               // both passes end at the next group
	ADDQ $4, R9
	INCQ R10
	DECQ R12
	JNZ  group
	VZEROUPPER
	RET
