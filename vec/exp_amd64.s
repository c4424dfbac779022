//go:build !purego

#include "textflag.h"

// Cephes' expf: n = floor(x·log2 e + 1/2), r = x − n·ln 2 (in two parts), e^r by a degree-7
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

// func expAVX2(dst, src *float32, n int)
TEXT ·expAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	VBROADCASTSS expConsts<>+0(SB), Y4
	VBROADCASTSS expConsts<>+4(SB), Y5
	VBROADCASTSS expConsts<>+8(SB), Y6
	VBROADCASTSS expConsts<>+12(SB), Y7
	VBROADCASTSS expConsts<>+16(SB), Y8
	VBROADCASTSS expConsts<>+20(SB), Y9
	VBROADCASTSS expConsts<>+24(SB), Y10
	VBROADCASTSS expConsts<>+28(SB), Y11
	VBROADCASTSS expConsts<>+32(SB), Y12
	VBROADCASTSS expConsts<>+36(SB), Y13
	VBROADCASTSS expConsts<>+40(SB), Y14
	VBROADCASTSS expConsts<>+44(SB), Y15

loop:
	VMOVUPS (SI), Y0
	VMINPS  Y0, Y4, Y0        // min(clamp, x): x when x is NaN
	VMAXPS  Y0, Y5, Y0
	VMOVAPS Y7, Y1
	VFMADD231PS Y6, Y0, Y1    // x·log2 e + 1/2
	VROUNDPS $1, Y1, Y1       // n = floor
	VFNMADD231PS Y8, Y1, Y0   // r = x − n·ln2_hi
	VFNMADD231PS Y9, Y1, Y0   // r −= n·ln2_lo
	VPBROADCASTD expConsts<>+52(SB), Y2
	VCVTTPS2DQ Y1, Y1         // n as int32
	VPADDD  Y2, Y1, Y1
	VPSLLD  $23, Y1, Y3       // 2^n
	VMOVAPS Y10, Y2
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
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER
	RET
