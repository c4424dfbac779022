//go:build !purego

#include "textflag.h"

// Cephes' expf: n = round(x·log2 e), r = x − n·ln 2 (in two parts), e^r by a degree-7
// polynomial, then the exponent n added to its bits.
DATA expConsts<>+0(SB)/4, $88.3762626647949   // clamp
DATA expConsts<>+4(SB)/4, $-88.3762626647949
DATA expConsts<>+8(SB)/4, $1.44269504088896341 // log2 e
DATA expConsts<>+12(SB)/4, $0.5
DATA expConsts<>+16(SB)/4, $0.693359375        // ln 2, high part
DATA expConsts<>+20(SB)/4, $-2.12194440e-4     // ln 2, low part
DATA expConsts<>+24(SB)/4, $1.9875691500e-4    // polynomial, highest degree first
DATA expConsts<>+28(SB)/4, $1.3981999507e-3
DATA expConsts<>+32(SB)/4, $8.3334519073e-3
DATA expConsts<>+36(SB)/4, $4.1665795894e-2
DATA expConsts<>+40(SB)/4, $1.6666665459e-1
DATA expConsts<>+44(SB)/4, $5.0000001201e-1
DATA expConsts<>+48(SB)/4, $1.0
DATA expConsts<>+52(SB)/4, $127
GLOBL expConsts<>(SB), RODATA|NOPTR, $56

// func expSumAVX2(dst, src *float32, n int, shift float32) float64
TEXT ·expSumAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	VBROADCASTSS shift+24(FP), Y7
	VBROADCASTSS expConsts<>+0(SB), Y4
	VBROADCASTSS expConsts<>+4(SB), Y5
	VBROADCASTSS expConsts<>+8(SB), Y6
	VBROADCASTSS expConsts<>+16(SB), Y8
	VBROADCASTSS expConsts<>+20(SB), Y9
	VXORPD       Y10, Y10, Y10           // Σ e, four float64 lanes
	VBROADCASTSS expConsts<>+28(SB), Y11
	VBROADCASTSS expConsts<>+32(SB), Y12
	VBROADCASTSS expConsts<>+36(SB), Y13
	VBROADCASTSS expConsts<>+40(SB), Y14
	VBROADCASTSS expConsts<>+44(SB), Y15

loop:
	VMOVUPS (SI), Y0
	VSUBPS  Y7, Y0, Y0        // x − shift
	VMINPS  Y0, Y4, Y0        // min(clamp, x): x when x is NaN
	VMAXPS  Y0, Y5, Y0
	VMULPS  Y6, Y0, Y1        // x·log2 e
	VROUNDPS $0, Y1, Y1       // n, to nearest
	VFNMADD231PS Y8, Y1, Y0   // r = x − n·ln2_hi
	VFNMADD231PS Y9, Y1, Y0   // r −= n·ln2_lo
	VPBROADCASTD expConsts<>+52(SB), Y2
	VCVTPS2DQ Y1, Y1          // n as int32
	VPADDD  Y2, Y1, Y1
	VPSLLD  $23, Y1, Y3       // 2^n
	VBROADCASTSS expConsts<>+24(SB), Y2
	VFMADD213PS Y11, Y0, Y2   // p = p·r + c
	VFMADD213PS Y12, Y0, Y2
	VFMADD213PS Y13, Y0, Y2
	VFMADD213PS Y14, Y0, Y2
	VFMADD213PS Y15, Y0, Y2
	VMULPS  Y0, Y0, Y1        // r²
	VFMADD231PS Y1, Y2, Y0    // r + p·r²
	VBROADCASTSS expConsts<>+48(SB), Y1
	VADDPS  Y1, Y0, Y0        // e^r
	VMULPS  Y3, Y0, Y0        // e^r · 2^n
	VMOVUPS Y0, (DI)
	VCVTPS2PD X0, Y1
	VADDPD  Y1, Y10, Y10
	VEXTRACTF128 $1, Y0, X0
	VCVTPS2PD X0, Y1
	VADDPD  Y1, Y10, Y10
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  loop

	VEXTRACTF128 $1, Y10, X1
	VADDPD  X1, X10, X10
	VHADDPD X10, X10, X10
	VMOVSD  X10, ret+32(FP)
	VZEROUPPER
	RET

// func maxAVX2(x *float32, n int) float32
TEXT ·maxAVX2(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $3, CX
	VMOVUPS (SI), Y0
	ADDQ $32, SI
	DECQ CX
	JZ   reduce

maxloop:
	VMAXPS (SI), Y0, Y0
	ADDQ $32, SI
	DECQ CX
	JNZ  maxloop

reduce:
	VEXTRACTF128 $1, Y0, X1
	VMAXPS  X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS  X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS  X1, X0, X0
	VMOVSS  X0, ret+16(FP)
	VZEROUPPER
	RET

// func scaleAVX2(x *float32, n int, a float32)
TEXT ·scaleAVX2(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $3, CX
	VBROADCASTSS a+16(FP), Y1

scaleloop:
	VMULPS (SI), Y1, Y0
	VMOVUPS Y0, (SI)
	ADDQ $32, SI
	DECQ CX
	JNZ  scaleloop
	VZEROUPPER
	RET
