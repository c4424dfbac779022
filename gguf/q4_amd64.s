//go:build !purego

#include "textflag.h"

// Constants: |x| mask, 8.5 and 15 (eight lanes each), then −8 and 1.
DATA q40<>+0(SB)/4, $0x7fffffff
DATA q40<>+4(SB)/4, $0x7fffffff
DATA q40<>+8(SB)/4, $0x7fffffff
DATA q40<>+12(SB)/4, $0x7fffffff
DATA q40<>+16(SB)/4, $0x7fffffff
DATA q40<>+20(SB)/4, $0x7fffffff
DATA q40<>+24(SB)/4, $0x7fffffff
DATA q40<>+28(SB)/4, $0x7fffffff
DATA q40<>+32(SB)/4, $0x41080000
DATA q40<>+36(SB)/4, $0x41080000
DATA q40<>+40(SB)/4, $0x41080000
DATA q40<>+44(SB)/4, $0x41080000
DATA q40<>+48(SB)/4, $0x41080000
DATA q40<>+52(SB)/4, $0x41080000
DATA q40<>+56(SB)/4, $0x41080000
DATA q40<>+60(SB)/4, $0x41080000
DATA q40<>+64(SB)/4, $0x0000000f
DATA q40<>+68(SB)/4, $0x0000000f
DATA q40<>+72(SB)/4, $0x0000000f
DATA q40<>+76(SB)/4, $0x0000000f
DATA q40<>+80(SB)/4, $0x0000000f
DATA q40<>+84(SB)/4, $0x0000000f
DATA q40<>+88(SB)/4, $0x0000000f
DATA q40<>+92(SB)/4, $0x0000000f
DATA q40<>+96(SB)/4, $0xc1000000 // -8
DATA q40<>+100(SB)/4, $0x3f800000 // 1
GLOBL q40<>(SB), RODATA|NOPTR, $104

// func q4_0AVX2(qs *byte, d *float32, x *float32, blocks int)
//
// quantize_row_q4_0_ref on whole blocks of 32: block b's scale goes to d[b], its 16 code bytes
// to qs[18b:18b+16]. The arithmetic is encodeSym's, in its order (no fused multiply-adds).
TEXT ·q4_0AVX2(SB), NOSPLIT, $0-32
	MOVQ qs+0(FP), DI
	MOVQ d+8(FP), DX
	MOVQ x+16(FP), SI
	MOVQ blocks+24(FP), CX
	VMOVUPS q40<>+0(SB), Y15
	VXORPS  X14, X14, X14

block:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VANDPS  Y15, Y0, Y4
	VANDPS  Y15, Y1, Y5
	VANDPS  Y15, Y2, Y6
	VANDPS  Y15, Y3, Y7
	VMAXPS  Y5, Y4, Y8
	VMAXPS  Y7, Y6, Y9
	VMAXPS  Y9, Y8, Y8
	VPERM2F128 $1, Y8, Y8, Y9
	VMAXPS  Y9, Y8, Y8
	VPERMILPS $0x4e, Y8, Y9
	VMAXPS  Y9, Y8, Y8
	VPERMILPS $0xb1, Y8, Y9
	VMAXPS  Y9, Y8, Y8        // amax in every lane

	// mx: the first value of largest magnitude (0 when all are zero, as ggml's loop leaves it).
	VXORPS  X10, X10, X10
	VUCOMISS X14, X8
	JE      scale
	VCMPPS  $0, Y8, Y4, Y9
	VMOVMSKPS Y9, AX
	VCMPPS  $0, Y8, Y5, Y9
	VMOVMSKPS Y9, BX
	SHLL    $8, BX
	ORL     BX, AX
	VCMPPS  $0, Y8, Y6, Y9
	VMOVMSKPS Y9, BX
	SHLL    $16, BX
	ORL     BX, AX
	VCMPPS  $0, Y8, Y7, Y9
	VMOVMSKPS Y9, BX
	SHLL    $24, BX
	ORL     BX, AX
	TZCNTL  AX, AX
	VMOVSS  (SI)(AX*4), X10

scale:
	VDIVSS  q40<>+96(SB), X10, X11 // d = mx/−8
	VMOVSS  X11, (DX)
	VXORPS  X12, X12, X12
	VUCOMISS X14, X11
	JE      codes
	VMOVSS  q40<>+100(SB), X12
	VDIVSS  X11, X12, X12          // id = 1/d

codes:
	VBROADCASTSS X12, Y12
	VMOVUPS q40<>+32(SB), Y13
	VMULPS  Y12, Y0, Y0
	VMULPS  Y12, Y1, Y1
	VMULPS  Y12, Y2, Y2
	VMULPS  Y12, Y3, Y3
	VADDPS  Y13, Y0, Y0
	VADDPS  Y13, Y1, Y1
	VADDPS  Y13, Y2, Y2
	VADDPS  Y13, Y3, Y3
	VCVTTPS2DQ Y0, Y0
	VCVTTPS2DQ Y1, Y1
	VCVTTPS2DQ Y2, Y2
	VCVTTPS2DQ Y3, Y3
	VMOVDQU q40<>+64(SB), Y13
	VPMINSD Y13, Y0, Y0
	VPMINSD Y13, Y1, Y1
	VPMINSD Y13, Y2, Y2
	VPMINSD Y13, Y3, Y3
	VPSLLD  $4, Y2, Y2             // code j+16 in the high nibble of byte j
	VPSLLD  $4, Y3, Y3
	VPOR    Y2, Y0, Y0
	VPOR    Y3, Y1, Y1
	VPACKUSDW Y1, Y0, Y0
	VPERMQ  $0xd8, Y0, Y0
	VPACKUSWB Y0, Y0, Y0
	VPERMQ  $0x08, Y0, Y0
	VMOVDQU X0, (DI)

	ADDQ $128, SI
	ADDQ $18, DI
	ADDQ $4, DX
	DECQ CX
	JNZ  block
	VZEROUPPER
	RET
