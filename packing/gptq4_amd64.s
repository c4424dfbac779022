//go:build !purego

#include "textflag.h"

// func packGPTQ4x8AVX2(dst *byte, codes *byte, k, n, blocks int) (bad uint64)
//
// packGPTQ4Rows for 8 rows of 4-bit codes (codes: row i at i·k) and the first blocks·64 codes
// of each: per block of 64 codes, each row's 64 bytes are squeezed to 8 words (code j of a word
// at bits 4j…4j+3), and the 8×8 words are transposed so that word row r of qweight gets the 8
// rows' words as 32 contiguous bytes (dst: word (0, first row); word rows are 4n bytes apart).
// Returns the OR of all code bytes, for the caller to check they fit in 4 bits.
TEXT ·packGPTQ4x8AVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ codes+8(FP), SI
	MOVQ k+16(FP), DX
	MOVQ n+24(FP), R8
	SHLQ $2, R8               // bytes between word rows
	MOVQ blocks+32(FP), CX
	LEAQ (DX)(DX*2), R9       // 3k
	LEAQ (R8)(R8*2), R11      // 3 word rows
	MOVL $0x00ff00ff, AX
	VMOVD AX, X10
	VPBROADCASTD X10, Y10
	VPXOR Y11, Y11, Y11       // OR of every code

#define SQUEEZE(lo, hi, y) \
	VMOVDQU lo, y; \
	VMOVDQU hi, Y8; \
	VPOR y, Y11, Y11; \
	VPOR Y8, Y11, Y11; \
	VPSRLW $4, y, Y9; \
	VPOR Y9, y, y; \
	VPAND Y10, y, y; \
	VPSRLW $4, Y8, Y9; \
	VPOR Y9, Y8, Y8; \
	VPAND Y10, Y8, Y8; \
	VPACKUSWB Y8, y, y; \
	VPERMQ $0xd8, y, y

block:
	LEAQ (SI)(DX*4), R10      // row 4
	SQUEEZE((SI), 32(SI), Y0)
	SQUEEZE((SI)(DX*1), 32(SI)(DX*1), Y1)
	SQUEEZE((SI)(DX*2), 32(SI)(DX*2), Y2)
	SQUEEZE((SI)(R9*1), 32(SI)(R9*1), Y3)
	SQUEEZE((R10), 32(R10), Y4)
	SQUEEZE((R10)(DX*1), 32(R10)(DX*1), Y5)
	SQUEEZE((R10)(DX*2), 32(R10)(DX*2), Y6)
	SQUEEZE((R10)(R9*1), 32(R10)(R9*1), Y7)
	// Transpose: Yi holds row i's words 0…7; word m of rows 0…7 goes to word row m.
	VPUNPCKLDQ Y1, Y0, Y8
	VPUNPCKHDQ Y1, Y0, Y9
	VPUNPCKLDQ Y3, Y2, Y0
	VPUNPCKHDQ Y3, Y2, Y1
	VPUNPCKLDQ Y5, Y4, Y2
	VPUNPCKHDQ Y5, Y4, Y3
	VPUNPCKLDQ Y7, Y6, Y4
	VPUNPCKHDQ Y7, Y6, Y5
	VPUNPCKLQDQ Y0, Y8, Y6    // words 0 (low lane), 4 (high lane) of rows 0…3
	VPUNPCKHQDQ Y0, Y8, Y7    // words 1, 5
	VPUNPCKLQDQ Y1, Y9, Y12   // words 2, 6
	VPUNPCKHQDQ Y1, Y9, Y13   // words 3, 7
	VPUNPCKLQDQ Y4, Y2, Y14   // the same of rows 4…7
	VPUNPCKHQDQ Y4, Y2, Y15
	VPUNPCKLQDQ Y5, Y3, Y8
	VPUNPCKHQDQ Y5, Y3, Y9
	LEAQ (DI)(R8*4), R10      // word row 4
	VPERM2I128 $0x20, Y14, Y6, Y0
	VMOVDQU Y0, (DI)
	VPERM2I128 $0x20, Y15, Y7, Y0
	VMOVDQU Y0, (DI)(R8*1)
	VPERM2I128 $0x20, Y8, Y12, Y0
	VMOVDQU Y0, (DI)(R8*2)
	VPERM2I128 $0x20, Y9, Y13, Y0
	VMOVDQU Y0, (DI)(R11*1)
	VPERM2I128 $0x31, Y14, Y6, Y0
	VMOVDQU Y0, (R10)
	VPERM2I128 $0x31, Y15, Y7, Y0
	VMOVDQU Y0, (R10)(R8*1)
	VPERM2I128 $0x31, Y8, Y12, Y0
	VMOVDQU Y0, (R10)(R8*2)
	VPERM2I128 $0x31, Y9, Y13, Y0
	VMOVDQU Y0, (R10)(R11*1)
	ADDQ $64, SI
	LEAQ (R10)(R8*4), DI      // word row 8
	DECQ CX
	JNZ  block
	VEXTRACTI128 $1, Y11, X0
	VPOR X0, X11, X11
	VPSHUFD $0x4e, X11, X0
	VPOR X0, X11, X11
	VMOVQ X11, AX
	MOVQ AX, bad+40(FP)
	VZEROUPPER
	RET
