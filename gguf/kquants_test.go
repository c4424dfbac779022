package gguf

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/fp"
)

// The oracles below compute each element of a k-quant block directly from its index, from
// the block structs of ggml-common.h (QK_K = 256), instead of walking the block as the
// package's decoders (and ggml's dequantize_row_*) do.

func u16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }

// scaleMinK4 is get_scale_min_k4: sub-block j's 6-bit scale and min in scales[12].
func scaleMinK4(s []byte, j int) (int, int) {
	if j < 4 {
		return int(s[j] % 64), int(s[j+4] % 64)
	}
	return int(s[j+4]%16) + int(s[j-4]/64)*16, int(s[j+4]/16) + int(s[j]/64)*16
}

func oracleK(t Type, b []byte, e int) float64 {
	switch t {
	case Q2_K: // scales[16] qs[64] d dmin
		d, dmin := half(b[80:82]), half(b[82:84])
		n, r := e/128, e%128 // half, position in it
		shift, l := 2*(r/32), r%32
		sc := b[e/16]
		q := int(b[16+32*n+l]>>shift) % 4
		return d*float64(sc%16)*float64(q) - dmin*float64(sc/16)
	case Q3_K: // hmask[32] qs[64] scales[12] d
		d := half(b[108:110])
		j := e / 16
		var low int
		if j < 8 {
			low = int(b[96+j] % 16)
		} else {
			low = int(b[96+j-8] / 16)
		}
		high := int(b[96+8+j%4]>>(2*(j/4))) % 4
		sc := low + 16*high - 32
		n, r := e/128, e%128
		shift, l := 2*(r/32), r%32
		q := int(b[32+32*n+l]>>shift) % 4
		if b[l]>>(4*n+r/32)%2 == 0 { // hmask bit: 8 bits per byte cover the 8 groups of 32
			q -= 4
		}
		return d * float64(sc) * float64(q)
	case Q4_K, Q5_K: // d dmin scales[12] (qh[32]) qs[128]
		d, dmin := half(b[0:2]), half(b[2:4])
		j := e / 32
		sc, m := scaleMinK4(b[4:16], j)
		c, l := e/64, e%32
		qs := 16
		if t == Q5_K {
			qs = 48
		}
		q := int(b[qs+32*c+l])
		if j%2 == 0 {
			q %= 16
		} else {
			q /= 16
		}
		if t == Q5_K && b[16+l]>>j%2 == 1 {
			q += 16
		}
		return d*float64(sc)*float64(q) - dmin*float64(m)
	case Q6_K: // ql[128] qh[64] scales[16] d
		d := half(b[208:210])
		n, r := e/128, e%128
		k, l := r/32, r%32
		lowByte := b[64*n+l+32*(k%2)]
		low := int(lowByte % 16)
		if k >= 2 {
			low = int(lowByte / 16)
		}
		hi := int(b[128+32*n+l]>>(2*k)) % 4
		sc := int(int8(b[192+e/16]))
		return d * float64(sc) * float64(low+16*hi-32)
	}
	panic("no oracle")
}

func TestKQuantDecodersMatchOracle(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	sane := func(b []byte) { binary.LittleEndian.PutUint16(b, fp.F32ToF16(float32(r.Float64()*0.01+1e-4))) }
	for _, typ := range []Type{Q2_K, Q3_K, Q4_K, Q5_K, Q6_K} {
		blocks := make([]byte, 3*typ.TypeSize())
		for i := range blocks {
			blocks[i] = byte(r.Uint32())
		}
		for b := 0; b < len(blocks); b += typ.TypeSize() { // finite scales
			blk := blocks[b:]
			switch typ {
			case Q2_K:
				sane(blk[80:])
				sane(blk[82:])
			case Q3_K:
				sane(blk[108:])
			case Q4_K, Q5_K:
				sane(blk[0:])
				sane(blk[2:])
			case Q6_K:
				sane(blk[208:])
			}
		}
		got, err := Decode(nil, typ, blocks)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 3*256 {
			t.Fatalf("%s: %d values", typ, len(got))
		}
		for i, v := range got {
			want := oracleK(typ, blocks[i/256*typ.TypeSize():], i%256)
			if math.Abs(float64(v)-want) > 1e-6*math.Abs(want)+1e-9 {
				t.Fatalf("%s element %d: %v, oracle %v", typ, i, v, want)
			}
		}
	}
}
