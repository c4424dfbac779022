// Package safetensors reads and writes the safetensors container: memory-mapped files and
// sharded checkpoint directories with zero-copy tensor views, every dtype of the format,
// strict validation, and a streaming writer whose tensors produce their bytes on demand.
package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/qpack-dev/qpack/fp"
)

// DType is a safetensors dtype string as it appears in a header.
type DType string

const (
	BOOL       DType = "BOOL"
	U8         DType = "U8"
	I8         DType = "I8"
	I16        DType = "I16"
	U16        DType = "U16"
	F16        DType = "F16"
	BF16       DType = "BF16"
	I32        DType = "I32"
	U32        DType = "U32"
	F32        DType = "F32"
	F64        DType = "F64"
	I64        DType = "I64"
	U64        DType = "U64"
	F8E5M2     DType = "F8_E5M2"
	F8E4M3     DType = "F8_E4M3"
	F8E4M3FNUZ DType = "F8_E4M3FNUZ"
	F8E5M2FNUZ DType = "F8_E5M2FNUZ"
	F8E8M0     DType = "F8_E8M0"
	F4         DType = "F4"
	F6E2M3     DType = "F6_E2M3"
	F6E3M2     DType = "F6_E3M2"
	C64        DType = "C64"
)

var dtypeBits = map[DType]int{
	BOOL: 8, U8: 8, I8: 8, I16: 16, U16: 16, F16: 16, BF16: 16, I32: 32, U32: 32, F32: 32,
	F64: 64, I64: 64, U64: 64, F8E5M2: 8, F8E4M3: 8, F8E4M3FNUZ: 8, F8E5M2FNUZ: 8, F8E8M0: 8,
	F4: 4, F6E2M3: 6, F6E3M2: 6, C64: 64,
}

// Bits is the size of one element in bits (4 and 6 for the sub-byte float formats), or 0
// for a dtype this package does not know.
func (d DType) Bits() int { return dtypeBits[d] }

// Known reports whether d is a dtype of the safetensors specification.
func (d DType) Known() bool { return dtypeBits[d] != 0 }

// IsFloat reports whether d holds real floating-point numbers that Float32 can convert.
func (d DType) IsFloat() bool { return decoders[d] != nil }

// decoders convert raw little-endian bytes of n elements to float32.
var decoders = map[DType]func(dst []float32, src []byte){
	F32: func(dst []float32, src []byte) {
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	},
	F64: func(dst []float32, src []byte) {
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	},
	F16: func(dst []float32, src []byte) {
		for i := range dst {
			dst[i] = fp.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	},
	BF16:       fp.DecodeBF16,
	F8E4M3:     bytewise(fp.E4M3ToF32),
	F8E5M2:     bytewise(fp.E5M2ToF32),
	F8E4M3FNUZ: bytewise(fp.E4M3FNUZToF32),
	F8E5M2FNUZ: bytewise(fp.E5M2FNUZToF32),
	F8E8M0:     bytewise(fp.E8M0ToF32),
	// F4 (MXFP4 E2M1): two elements per byte, the first in the low nibble (PyTorch's
	// float4_e2m1fn_x2 packing).
	F4: func(dst []float32, src []byte) {
		for i := range dst {
			dst[i] = fp.F4E2M1ToF32(src[i/2] >> (4 * (i & 1)))
		}
	},
}

func bytewise(f func(uint8) float32) func([]float32, []byte) {
	return func(dst []float32, src []byte) {
		for i := range dst {
			dst[i] = f(src[i])
		}
	}
}

// DecodeFloat32 converts n elements of dtype d from raw little-endian bytes into dst[:n].
func DecodeFloat32(d DType, dst []float32, src []byte) error {
	dec := decoders[d]
	if dec == nil {
		return fmt.Errorf("dtype %s cannot be converted to float32", d)
	}
	if need := byteSize(d, int64(len(dst))); int64(len(src)) < need {
		return fmt.Errorf("dtype %s: %d bytes for %d elements, need %d", d, len(src), len(dst), need)
	}
	decodeParallel(dec, d.Bits()/8, dst, src)
	return nil
}

// decodeParallel runs dec over pieces of a large tensor on every core: a 7B block's weights
// are 0.8 GB of float32, which one core took about half a second to decode, longer than the
// GPU's statistics pass over the block. Elements narrower than a byte are decoded in one piece.
func decodeParallel(dec func(dst []float32, src []byte), size int, dst []float32, src []byte) {
	const piece = 1 << 20 // elements
	workers := min(runtime.GOMAXPROCS(0), len(dst)/piece)
	if size == 0 || workers < 2 {
		dec(dst, src)
		return
	}
	per := (len(dst) + workers - 1) / workers
	var wg sync.WaitGroup
	for at := 0; at < len(dst); at += per {
		end := min(at+per, len(dst))
		wg.Go(func() { dec(dst[at:end], src[at*size:end*size]) })
	}
	wg.Wait()
}

// EncodeFloat32 stores float32 values as little-endian F16, BF16 (rounding to nearest even)
// or F32; it panics on another dtype, which callers rule out first.
func EncodeFloat32(d DType, v []float32) []byte {
	out := make([]byte, d.Bits()/8*len(v))
	for i, x := range v {
		switch d {
		case F16:
			binary.LittleEndian.PutUint16(out[2*i:], fp.F32ToF16(x))
		case BF16:
			binary.LittleEndian.PutUint16(out[2*i:], fp.F32ToBF16(x))
		case F32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		default:
			panic("safetensors: EncodeFloat32 to " + string(d))
		}
	}
	return out
}

// byteSize is the stored size of n elements: ceil(n·bits/8).
func byteSize(d DType, n int64) int64 { return (n*int64(d.Bits()) + 7) / 8 }

// firstWordNotFinite returns the offset of the first 32- or 8-byte piece of raw that holds an element
// (of size bytes, 2 or 4) whose exponent bits, mask, are all set, or of the bytes after the last
// whole word. Each lane of the word, masked, is xored with the mask: a lane is zero exactly
// where its exponent is all ones, and no lane has its top bit set (the masks leave the sign
// out), so the zero-lane test (v − 1s) & ^v & top bits is exact.
func firstWordNotFinite(raw []byte, size int, mask uint64) int {
	var masks, ones, tops uint64
	for lane := 0; lane < 8; lane += size {
		shift := uint(8 * lane)
		masks |= mask << shift
		ones |= 1 << shift
		tops |= 1 << (shift + uint(8*size) - 1)
	}
	zeroLane := func(w uint64) bool {
		v := w&masks ^ masks
		return (v-ones)&^v&tops != 0
	}
	i := 0
	for ; i+32 <= len(raw); i += 32 { // four words a test
		w := raw[i : i+32]
		a, b := binary.LittleEndian.Uint64(w), binary.LittleEndian.Uint64(w[8:])
		c, d := binary.LittleEndian.Uint64(w[16:]), binary.LittleEndian.Uint64(w[24:])
		if zeroLane(a) || zeroLane(b) || zeroLane(c) || zeroLane(d) {
			return i
		}
	}
	for ; i+8 <= len(raw); i += 8 {
		if zeroLane(binary.LittleEndian.Uint64(raw[i:])) {
			return i
		}
	}
	return i
}

// exponentMasks are the exponent bits of the IEEE-style dtypes: all of them set means NaN or ±Inf.
var exponentMasks = map[DType]uint64{F16: 0x7c00, BF16: 0x7f80, F32: 0x7f800000, F64: 0x7ff0000000000000}

// FirstNonFinite returns the index of the first NaN or ±Inf among the little-endian elements
// of dtype d in raw, or −1 when there is none or d is not an F16, BF16, F32 or F64 dtype.
// Narrower elements are tested a 64-bit word at a time, and a large tensor in pieces on every
// core (a GPU pass checks the bytes it uploads without widening them on the host: a 7B's MLP
// weight in BF16 took 18 ms on one core).
func FirstNonFinite(d DType, raw []byte) int {
	mask, ok := exponentMasks[d]
	if !ok {
		return -1
	}
	size := d.Bits() / 8
	const piece = 1 << 22 // bytes
	workers := min(runtime.GOMAXPROCS(0), len(raw)/piece)
	if workers < 2 {
		return firstNonFinite(raw, size, mask)
	}
	per := (len(raw)/size + workers - 1) / workers * size
	found := make([]int, 0, workers)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for at := 0; at < len(raw); at += per {
		wg.Go(func() {
			if i := firstNonFinite(raw[at:min(at+per, len(raw))], size, mask); i >= 0 {
				mu.Lock()
				found = append(found, at/size+i)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(found) == 0 {
		return -1
	}
	return slices.Min(found)
}

// firstNonFinite is FirstNonFinite on one goroutine, for elements of size bytes whose exponent
// bits are mask.
func firstNonFinite(raw []byte, size int, mask uint64) int {
	i := 0
	if size < 8 {
		i = firstWordNotFinite(raw, size, mask)
	}
	for ; i+size <= len(raw); i += size {
		var bits uint64
		switch size {
		case 2:
			bits = uint64(binary.LittleEndian.Uint16(raw[i:]))
		case 4:
			bits = uint64(binary.LittleEndian.Uint32(raw[i:]))
		default:
			bits = binary.LittleEndian.Uint64(raw[i:])
		}
		if bits&mask == mask {
			return i / size
		}
	}
	return -1
}
