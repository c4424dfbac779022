//go:build !purego

#include "textflag.h"

// Constants, eight lanes each: 1.5·2^23 (nearest_int's shift), the mantissa mask, 2^22, 1.0 and
// the sign bit.
DATA sm8<>+0(SB)/4, $0x4b400000
DATA sm8<>+4(SB)/4, $0x4b400000
DATA sm8<>+8(SB)/4, $0x4b400000
DATA sm8<>+12(SB)/4, $0x4b400000
DATA sm8<>+16(SB)/4, $0x4b400000
DATA sm8<>+20(SB)/4, $0x4b400000
DATA sm8<>+24(SB)/4, $0x4b400000
DATA sm8<>+28(SB)/4, $0x4b400000
DATA sm8<>+32(SB)/4, $0x007fffff
DATA sm8<>+36(SB)/4, $0x007fffff
DATA sm8<>+40(SB)/4, $0x007fffff
DATA sm8<>+44(SB)/4, $0x007fffff
DATA sm8<>+48(SB)/4, $0x007fffff
DATA sm8<>+52(SB)/4, $0x007fffff
DATA sm8<>+56(SB)/4, $0x007fffff
DATA sm8<>+60(SB)/4, $0x007fffff
DATA sm8<>+64(SB)/4, $0x00400000
DATA sm8<>+68(SB)/4, $0x00400000
DATA sm8<>+72(SB)/4, $0x00400000
DATA sm8<>+76(SB)/4, $0x00400000
DATA sm8<>+80(SB)/4, $0x00400000
DATA sm8<>+84(SB)/4, $0x00400000
DATA sm8<>+88(SB)/4, $0x00400000
DATA sm8<>+92(SB)/4, $0x00400000
DATA sm8<>+96(SB)/4, $0x3f800000
DATA sm8<>+100(SB)/4, $0x3f800000
DATA sm8<>+104(SB)/4, $0x3f800000
DATA sm8<>+108(SB)/4, $0x3f800000
DATA sm8<>+112(SB)/4, $0x3f800000
DATA sm8<>+116(SB)/4, $0x3f800000
DATA sm8<>+120(SB)/4, $0x3f800000
DATA sm8<>+124(SB)/4, $0x3f800000
DATA sm8<>+128(SB)/4, $0x80000000
DATA sm8<>+132(SB)/4, $0x80000000
DATA sm8<>+136(SB)/4, $0x80000000
DATA sm8<>+140(SB)/4, $0x80000000
DATA sm8<>+144(SB)/4, $0x80000000
DATA sm8<>+148(SB)/4, $0x80000000
DATA sm8<>+152(SB)/4, $0x80000000
DATA sm8<>+156(SB)/4, $0x80000000
GLOBL sm8<>(SB), RODATA|NOPTR, $160

// Field offsets of scaleMin8 (TestScaleMin8Layout checks them).
#define X 0
#define W 1024
#define L 2048
#define AUX 3072
#define STEPS 4096
#define NMAX 4352
#define SCALE 4384
#define NEGMIN 4416
#define LO0 4448
#define COUNT 4480

// CODE sets dst (int32 lanes) to clamp(nearest_int(iscale·(x[i] − lo)), 0, nmax), the x of
// row AX; Y0 = lo, Y6 = iscale, Y14 = 0, Y15 = nmax.
#define CODE(dst) \
	VMOVUPS X(DI)(AX*1), dst; \
	VSUBPS  Y0, dst, dst; \
	VMULPS  Y6, dst, dst; \
	VADDPS  sm8<>+0(SB), dst, dst; \
	VPAND   sm8<>+32(SB), dst, dst; \
	VPSUBD  sm8<>+64(SB), dst, dst; \
	VPMAXSD Y14, dst, dst; \
	VPMINSD Y15, dst, dst

// func scaleMin8AVX2(s *scaleMin8)
//
// fitScaleMin with mad false, one sub-block per lane. Registers: Y0 lo, Y1 hi, Y2 Σw, Y3 Σwx,
// Y4 the best scale, Y5 the best error, Y6 iscale (then the d > 0 mask), Y7–Y9 the step's sums
// (then its scale, min and error), Y10–Y13 scratch, Y14 zero, Y15 nmax.
TEXT ·scaleMin8AVX2(SB), NOSPLIT, $0-8
	MOVQ s+0(FP), DI
	VXORPS  Y14, Y14, Y14
	VMOVDQU NMAX(DI), Y15

	// The range, Σw and Σwx.
	VMOVUPS X(DI), Y0
	VMOVAPS Y0, Y1
	VMOVUPS W(DI), Y2
	VMULPS  Y0, Y2, Y3
	MOVQ $32, AX
sums:
	VMOVUPS X(DI)(AX*1), Y10
	VMINPS  Y0, Y10, Y0      // lo = x < lo ? x : lo
	VMAXPS  Y1, Y10, Y1      // hi = x > hi ? x : hi
	VMOVUPS W(DI)(AX*1), Y11
	VADDPS  Y11, Y2, Y2
	VMULPS  Y10, Y11, Y11
	VADDPS  Y11, Y3, Y3
	ADDQ $32, AX
	CMPQ AX, $1024
	JLT  sums
	VMINPS  Y0, Y14, Y0      // lo = 0 < lo ? 0 : lo
	VMOVUPS Y0, LO0(DI)

	// The first codes, at nmax/(hi − lo), and their error.
	VCVTDQ2PS Y15, Y10
	VSUBPS  Y0, Y1, Y11
	VDIVPS  Y11, Y10, Y6
	VMOVUPS sm8<>+96(SB), Y4
	VDIVPS  Y6, Y4, Y4       // scale = 1/iscale
	VXORPS  Y5, Y5, Y5
	XORQ AX, AX
first:
	CODE(Y10)
	VMOVDQU Y10, L(DI)(AX*1)
	VCVTDQ2PS Y10, Y11
	VMULPS  Y4, Y11, Y11
	VADDPS  Y0, Y11, Y11
	VSUBPS  X(DI)(AX*1), Y11, Y11
	VMULPS  Y11, Y11, Y11
	VMULPS  W(DI)(AX*1), Y11, Y11
	VADDPS  Y11, Y5, Y5
	ADDQ $32, AX
	CMPQ AX, $1024
	JLT  first

	// The sweep.
	XORQ BX, BX
step:
	VSUBPS  Y0, Y1, Y10
	VBROADCASTSS STEPS(DI)(BX*4), Y6
	VDIVPS  Y10, Y6, Y6
	VXORPS  Y7, Y7, Y7
	VXORPS  Y8, Y8, Y8
	VXORPS  Y9, Y9, Y9
	XORQ AX, AX
stepsums:
	CODE(Y10)
	VMOVDQU Y10, AUX(DI)(AX*1)
	VCVTDQ2PS Y10, Y11
	VMULPS  W(DI)(AX*1), Y11, Y12 // w·l
	VADDPS  Y12, Y7, Y7
	VMULPS  Y11, Y12, Y13         // w·l·l
	VADDPS  Y13, Y8, Y8
	VMULPS  X(DI)(AX*1), Y12, Y13 // w·l·x
	VADDPS  Y13, Y9, Y9
	ADDQ $32, AX
	CMPQ AX, $1024
	JLT  stepsums

	VMULPS  Y8, Y2, Y10      // d = Σw·Σwl² − (Σwl)²
	VMULPS  Y7, Y7, Y11
	VSUBPS  Y11, Y10, Y10
	VMULPS  Y9, Y2, Y11      // scale = (Σw·Σwlx − Σwx·Σwl)/d
	VMULPS  Y7, Y3, Y12
	VSUBPS  Y12, Y11, Y11
	VDIVPS  Y10, Y11, Y11
	VMULPS  Y3, Y8, Y12      // min = (Σwl²·Σwx − Σwl·Σwlx)/d
	VMULPS  Y9, Y7, Y13
	VSUBPS  Y13, Y12, Y12
	VDIVPS  Y10, Y12, Y12
	VCMPPS  $0x1e, Y14, Y12, Y13 // min > 0: min = 0, scale = Σwlx/Σwl²
	VDIVPS  Y8, Y9, Y7
	VBLENDVPS Y13, Y7, Y11, Y7
	VBLENDVPS Y13, Y14, Y12, Y8
	VCMPPS  $0x1e, Y14, Y10, Y6  // d > 0
	VXORPS  Y9, Y9, Y9
	XORQ AX, AX
steperr:
	VCVTDQ2PS AUX(DI)(AX*1), Y10
	VMULPS  Y7, Y10, Y10
	VADDPS  Y8, Y10, Y10
	VSUBPS  X(DI)(AX*1), Y10, Y10
	VMULPS  Y10, Y10, Y10
	VMULPS  W(DI)(AX*1), Y10, Y10
	VADDPS  Y10, Y9, Y9
	ADDQ $32, AX
	CMPQ AX, $1024
	JLT  steperr

	VCMPPS  $0x11, Y5, Y9, Y10   // better: d > 0 and error < best
	VANDPS  Y6, Y10, Y10
	VMOVMSKPS Y10, AX
	TESTL AX, AX
	JZ   nextstep
	VBLENDVPS Y10, Y9, Y5, Y5
	VBLENDVPS Y10, Y7, Y4, Y4
	VBLENDVPS Y10, Y8, Y0, Y0
	XORQ AX, AX
keep:
	VMOVDQU L(DI)(AX*1), Y11
	VBLENDVPS Y10, AUX(DI)(AX*1), Y11, Y11
	VMOVDQU Y11, L(DI)(AX*1)
	ADDQ $32, AX
	CMPQ AX, $1024
	JLT  keep
nextstep:
	INCQ BX
	CMPQ BX, COUNT(DI)
	JLT  step

	// Lanes whose weights are all equal: codes 0, scale 0, min −lo.
	VMOVUPS LO0(DI), Y10
	VCMPPS  $0x00, Y10, Y1, Y11
	VBLENDVPS Y11, Y14, Y4, Y4
	VBLENDVPS Y11, Y10, Y0, Y0
	VXORPS  sm8<>+128(SB), Y0, Y0
	VMOVUPS Y4, SCALE(DI)
	VMOVUPS Y0, NEGMIN(DI)
	VMOVMSKPS Y11, AX
	TESTL AX, AX
	JZ   done
	XORQ AX, AX
flat:
	VMOVDQU L(DI)(AX*1), Y12
	VBLENDVPS Y11, Y14, Y12, Y12
	VMOVDQU Y12, L(DI)(AX*1)
	ADDQ $32, AX
	CMPQ AX, $1024
	JLT  flat
done:
	VZEROUPPER
	RET
