package gguf

import "math"

// MXFP4 is OCP MXFP4 (ggml-common.h block_mxfp4): blocks of 32 weights as {u8 e; u8 qs[16]},
// e the E8M0 exponent, qs[j] holding the E2M1 codes of elements j (low nibble) and j+16 (high).
const MXFP4 Type = 39

func init() { types[MXFP4] = typeInfo{"MXFP4", 32, 17} }

// kvaluesFP4 are ggml's E2M1 values doubled (kvalues_mxfp4), indexed by code (sign in bit 3).
var kvaluesFP4 = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// decodeMXFP4 is dequantize_row_mxfp4 for one block: d = 2^(e−128) (GGML_E8M0_TO_FP32_HALF,
// half the E8M0 scale, as the values are doubled), element j = kvalues[qs[j] & 15]·d and
// element j+16 = kvalues[qs[j] >> 4]·d.
func decodeMXFP4(dst []float32, blk []byte) []float32 {
	d := float32(math.Ldexp(1, int(blk[0])-128))
	var out [32]float32
	for j, q := range blk[1:17] {
		out[j] = float32(kvaluesFP4[q&15]) * d
		out[j+16] = float32(kvaluesFP4[q>>4]) * d
	}
	return append(dst, out[:]...)
}
