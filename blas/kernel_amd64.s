//go:build !purego

#include "textflag.h"

// Micro-kernels: C[mr×nr] (=|+=) A·B for one packed panel of A (kc steps of mr values) and one
// of B (kc steps of nr values). Each output keeps its own accumulator lane, summed in step order
// with fused multiply-adds, so both kernels give the same bits for the same tile.

// --- AVX-512: 14 rows × 32 columns, 28 accumulators Z0..Z27, B in Z28/Z29, A broadcast in Z30.

#define ROW512(off, acc0, acc1) \
	VBROADCASTSS off(SI), Z30; \
	VFMADD231PS  Z28, Z30, acc0; \
	VFMADD231PS  Z29, Z30, acc1

#define STORE512(acc0, acc1) \
	VMOVUPS acc0, (DX); \
	VMOVUPS acc1, 64(DX); \
	ADDQ    R8, DX

#define ADD512(acc0, acc1) \
	VADDPS  (DX), acc0, acc0; \
	VADDPS  64(DX), acc1, acc1; \
	VMOVUPS acc0, (DX); \
	VMOVUPS acc1, 64(DX); \
	ADDQ    R8, DX

#define ROWS512(M) \
	M(Z0, Z1); M(Z2, Z3); M(Z4, Z5); M(Z6, Z7); M(Z8, Z9); M(Z10, Z11); M(Z12, Z13); \
	M(Z14, Z15); M(Z16, Z17); M(Z18, Z19); M(Z20, Z21); M(Z22, Z23); M(Z24, Z25); M(Z26, Z27)

// func kernel14x32(kc int, a, b, c *float32, ldc int, add int)
TEXT ·kernel14x32(SB), NOSPLIT, $0-48
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DI
	MOVQ c+24(FP), DX
	MOVQ ldc+32(FP), R8
	SHLQ $2, R8

	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	VPXORD Z16, Z16, Z16
	VPXORD Z17, Z17, Z17
	VPXORD Z18, Z18, Z18
	VPXORD Z19, Z19, Z19
	VPXORD Z20, Z20, Z20
	VPXORD Z21, Z21, Z21
	VPXORD Z22, Z22, Z22
	VPXORD Z23, Z23, Z23
	VPXORD Z24, Z24, Z24
	VPXORD Z25, Z25, Z25
	VPXORD Z26, Z26, Z26
	VPXORD Z27, Z27, Z27

	TESTQ CX, CX
	JZ    done512

loop512:
	VMOVUPS (DI), Z28
	VMOVUPS 64(DI), Z29
	ROW512(0, Z0, Z1)
	ROW512(4, Z2, Z3)
	ROW512(8, Z4, Z5)
	ROW512(12, Z6, Z7)
	ROW512(16, Z8, Z9)
	ROW512(20, Z10, Z11)
	ROW512(24, Z12, Z13)
	ROW512(28, Z14, Z15)
	ROW512(32, Z16, Z17)
	ROW512(36, Z18, Z19)
	ROW512(40, Z20, Z21)
	ROW512(44, Z22, Z23)
	ROW512(48, Z24, Z25)
	ROW512(52, Z26, Z27)
	ADDQ $56, SI
	ADDQ $128, DI
	DECQ CX
	JNZ  loop512

done512:
	MOVQ add+40(FP), AX
	TESTQ AX, AX
	JNZ  accumulate512
	ROWS512(STORE512)
	VZEROUPPER
	RET

accumulate512:
	ROWS512(ADD512)
	VZEROUPPER
	RET

// --- AVX2 + FMA: 6 rows × 16 columns, 12 accumulators Y0..Y11, B in Y12/Y13, A broadcast in Y14.

#define ROW256(off, acc0, acc1) \
	VBROADCASTSS off(SI), Y14; \
	VFMADD231PS  Y12, Y14, acc0; \
	VFMADD231PS  Y13, Y14, acc1

#define STORE256(acc0, acc1) \
	VMOVUPS acc0, (DX); \
	VMOVUPS acc1, 32(DX); \
	ADDQ    R8, DX

#define ADD256(acc0, acc1) \
	VADDPS  (DX), acc0, acc0; \
	VADDPS  32(DX), acc1, acc1; \
	VMOVUPS acc0, (DX); \
	VMOVUPS acc1, 32(DX); \
	ADDQ    R8, DX

#define ROWS256(M) \
	M(Y0, Y1); M(Y2, Y3); M(Y4, Y5); M(Y6, Y7); M(Y8, Y9); M(Y10, Y11)

// func kernel6x16(kc int, a, b, c *float32, ldc int, add int)
TEXT ·kernel6x16(SB), NOSPLIT, $0-48
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DI
	MOVQ c+24(FP), DX
	MOVQ ldc+32(FP), R8
	SHLQ $2, R8

	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11

	TESTQ CX, CX
	JZ    done256

loop256:
	VMOVUPS (DI), Y12
	VMOVUPS 32(DI), Y13
	ROW256(0, Y0, Y1)
	ROW256(4, Y2, Y3)
	ROW256(8, Y4, Y5)
	ROW256(12, Y6, Y7)
	ROW256(16, Y8, Y9)
	ROW256(20, Y10, Y11)
	ADDQ $24, SI
	ADDQ $64, DI
	DECQ CX
	JNZ  loop256

done256:
	MOVQ add+40(FP), AX
	TESTQ AX, AX
	JNZ  accumulate256
	ROWS256(STORE256)
	VZEROUPPER
	RET

accumulate256:
	ROWS256(ADD256)
	VZEROUPPER
	RET

// func transpose8(dst *float32, dstStride int, src *float32, srcStride int, alpha float32)
// dst[p·dstStride + r] = alpha·src[r·srcStride + p] for r, p < 8 (strides in values).
TEXT ·transpose8(SB), NOSPLIT, $0-36
	MOVQ dst+0(FP), DI
	MOVQ dstStride+8(FP), R8
	MOVQ src+16(FP), SI
	MOVQ srcStride+24(FP), R9
	SHLQ $2, R8
	SHLQ $2, R9
	VBROADCASTSS alpha+32(FP), Y15
	LEAQ (R9)(R9*2), R10      // 3 rows
	VMOVUPS (SI), Y0
	VMOVUPS (SI)(R9*1), Y1
	VMOVUPS (SI)(R9*2), Y2
	VMOVUPS (SI)(R10*1), Y3
	LEAQ (SI)(R9*4), SI
	VMOVUPS (SI), Y4
	VMOVUPS (SI)(R9*1), Y5
	VMOVUPS (SI)(R9*2), Y6
	VMOVUPS (SI)(R10*1), Y7
	VUNPCKLPS Y1, Y0, Y8
	VUNPCKHPS Y1, Y0, Y9
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y0
	VSHUFPS $0x44, Y10, Y8, Y1
	VSHUFPS $0xee, Y10, Y8, Y2
	VSHUFPS $0x44, Y11, Y9, Y3
	VSHUFPS $0xee, Y11, Y9, Y4
	VSHUFPS $0x44, Y14, Y12, Y5
	VSHUFPS $0xee, Y14, Y12, Y6
	VSHUFPS $0x44, Y0, Y13, Y7
	VSHUFPS $0xee, Y0, Y13, Y8
	VPERM2F128 $0x20, Y5, Y1, Y9
	VPERM2F128 $0x20, Y6, Y2, Y10
	VPERM2F128 $0x20, Y7, Y3, Y11
	VPERM2F128 $0x20, Y8, Y4, Y12
	VPERM2F128 $0x31, Y5, Y1, Y13
	VPERM2F128 $0x31, Y6, Y2, Y14
	VPERM2F128 $0x31, Y7, Y3, Y0
	VPERM2F128 $0x31, Y8, Y4, Y1
	LEAQ (R8)(R8*2), R10
	VMULPS Y15, Y9, Y9
	VMULPS Y15, Y10, Y10
	VMULPS Y15, Y11, Y11
	VMULPS Y15, Y12, Y12
	VMULPS Y15, Y13, Y13
	VMULPS Y15, Y14, Y14
	VMULPS Y15, Y0, Y0
	VMULPS Y15, Y1, Y1
	VMOVUPS Y9, (DI)
	VMOVUPS Y10, (DI)(R8*1)
	VMOVUPS Y11, (DI)(R8*2)
	VMOVUPS Y12, (DI)(R10*1)
	LEAQ (DI)(R8*4), DI
	VMOVUPS Y13, (DI)
	VMOVUPS Y14, (DI)(R8*1)
	VMOVUPS Y0, (DI)(R8*2)
	VMOVUPS Y1, (DI)(R10*1)
	VZEROUPPER
	RET

// func axpby64(dst *float64, src *float32, n int, alpha, beta float64)
// dst[j] = beta·dst[j] + alpha·src[j] for j < n: a float32 tile folded into float64 sums.
TEXT ·axpby64(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSD alpha+24(FP), Y14
	VBROADCASTSD beta+32(FP), Y15
	CMPQ CX, $4
	JLT  tail

loop4:
	VCVTPS2PD (SI), Y0
	VMULPD  Y14, Y0, Y0
	VFMADD231PD (DI), Y15, Y0
	VMOVUPD Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	SUBQ $4, CX
	CMPQ CX, $4
	JGE  loop4

tail:
	TESTQ CX, CX
	JZ    done

loop1:
	VCVTSS2SD (SI), X0, X0
	VMULSD  X14, X0, X0
	VFMADD231SD (DI), X15, X0
	VMOVSD  X0, (DI)
	ADDQ $4, SI
	ADDQ $8, DI
	DECQ CX
	JNZ  loop1

done:
	VZEROUPPER
	RET
