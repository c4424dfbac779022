package packing

import (
	"encoding/binary"
	"fmt"
)

// Word is a storage unit of a packed bitstream: bytes (qpack) or 32-bit words (GPTQ, AWQ,
// compressed-tensors, whose int32 tensors are these words reinterpreted).
type Word interface{ ~uint8 | ~uint32 }

func wordBits[W Word]() int {
	var w W
	w-- // all ones
	if uint32(w) == 0xff {
		return 8
	}
	return 32
}

// PackedLen is the number of W words that count b-bit codes occupy in a dense bitstream.
func PackedLen[W Word](count, bits int) int {
	wb := wordBits[W]()
	return (count*bits + wb - 1) / wb
}

// checkBits accepts the code widths the bitstreams hold: 1 to 8 bits (the layouts say which
// of them they take).
func checkBits(bits int) error {
	if bits < 1 || bits > 8 {
		return fmt.Errorf("packing: %d-bit codes are not supported (want 1 to 8)", bits)
	}
	return nil
}

// PackStream writes count b-bit codes, read from src[0], src[srcStride], src[2·srcStride], …,
// as one dense little-endian bitstream into the words dst[0], dst[dstStride], … :
// code i occupies stream bits [i·b, i·b+b), and stream bit j is bit j mod w of word j / w
// (w = 8 or 32). For b ∈ {1, 2, 4, 8} no code straddles a word, so this is the plain
// "code j·pf+i at shift i·b" packing of GPTQ and compressed-tensors; for b = 3 it is GPTQ's
// 32-codes-in-3-words layout. PackedLen words are written; unused high bits of the last one
// are zero. A code ≥ 2^b is an error (reported with its index i).
func PackStream[W Word](dst []W, dstStride int, src []uint8, srcStride, count, bits int) error {
	if err := checkBits(bits); err != nil {
		return err
	}
	wb := uint(wordBits[W]())
	b := uint(bits)
	limit := uint64(1) << b
	i, d := 0, 0
	if bits == 4 && srcStride == 1 && wb == 32 {
		i, d = pack4Words(dst, dstStride, src, count)
	}
	if srcStride == 1 && dstStride == 1 {
		switch out := any(dst).(type) {
		case []uint8:
			i, d = packBytes(out[:PackedLen[uint8](count, bits)], src, count, bits)
		case []uint32:
			if bits != 4 { // pack4Words did these
				i, d = packWords(out[:min(len(out), PackedLen[uint32](count, bits))], src, count, bits)
			}
		}
	}
	var acc uint64 // pending stream bits, lowest first
	var have uint  // how many bits acc holds
	for s := i * srcStride; i < count; i, s = i+1, s+srcStride {
		c := uint64(src[s])
		if c >= limit {
			return fmt.Errorf("packing: code %d at index %d does not fit in %d bits", c, i, bits)
		}
		acc |= c << have
		have += b
		if have >= wb {
			dst[d] = W(acc)
			d += dstStride
			acc >>= wb
			have -= wb
		}
	}
	if have > 0 {
		dst[d] = W(acc)
	}
	return nil
}

// packBytes is PackStream's fast path for contiguous codes into contiguous bytes (dst holds
// exactly the packed bytes): eight codes, read as one little-endian uint64 (code j in byte j),
// are squeezed together in three steps (pairs, fours, all eight: each lane's upper half
// shifted down onto the end of its lower half) and fill exactly bits bytes. It packs whole
// groups of eight while a uint64 store stays inside dst, and returns how many codes it
// consumed and the next byte; a code ≥ 2^bits stops it, leaving the error to the general loop.
func packBytes(dst, src []uint8, count, bits int) (i, d int) {
	b := uint(bits)
	above := ^(0x0101010101010101 * (uint64(1)<<b - 1)) // the bits of each byte a code must not set
	for ; i+8 <= count && d+8 <= len(dst); i, d = i+8, d+bits {
		x := binary.LittleEndian.Uint64(src[i:])
		if x&above != 0 {
			break
		}
		x = x&0x00FF00FF00FF00FF | (x&0xFF00FF00FF00FF00)>>(8-b)
		x = x&0x0000FFFF0000FFFF | (x&0xFFFF0000FFFF0000)>>(16-2*b)
		x = x&0x00000000FFFFFFFF | (x&0xFFFFFFFF00000000)>>(32-4*b)
		binary.LittleEndian.PutUint64(dst[d:], x) // its bytes past d+bits are 0, written again next
	}
	return i, d
}

// packWords is PackStream's fast path for contiguous codes into contiguous 32-bit words: 32
// codes fill exactly bits words, packed as bytes (packBytes) and read back as little-endian words.
// It returns how many codes it consumed and the next word; a code ≥ 2^bits stops it, leaving the
// error to the general loop.
func packWords(dst []uint32, src []uint8, count, bits int) (i, d int) {
	var buf [40]byte // 4·bits bytes, and room for packBytes' last uint64 store
	for ; i+32 <= count && d+bits <= len(dst); i, d = i+32, d+bits {
		if n, _ := packBytes(buf[:], src[i:i+32], 32, bits); n < 32 {
			break
		}
		for j := range bits {
			dst[d+j] = binary.LittleEndian.Uint32(buf[4*j:])
		}
	}
	return i, d
}

// pack4Words is PackStream's fast path for contiguous 4-bit codes into 32-bit words: eight
// codes are read as one little-endian uint64 (code j in byte j) and their low nibbles squeezed
// together (code j to bits 4j…4j+3). It packs whole words only and returns how many codes it
// consumed and the index of the next word; a code ≥ 16 stops it, leaving the error to the
// general loop.
func pack4Words[W Word](dst []W, dstStride int, src []uint8, count int) (i, d int) {
	for ; i+8 <= count; i, d = i+8, d+dstStride {
		x := binary.LittleEndian.Uint64(src[i:])
		if x&0xF0F0F0F0F0F0F0F0 != 0 {
			break
		}
		x = (x | x>>4) & 0x00FF00FF00FF00FF
		x = (x | x>>8) & 0x0000FFFF0000FFFF
		x = (x | x>>16) & 0x00000000FFFFFFFF
		dst[d] = W(x)
	}
	return i, d
}

// UnpackStream is the inverse of PackStream: it reads count b-bit codes from the bitstream
// in src[0], src[srcStride], … and writes them to dst[0], dst[dstStride], … .
func UnpackStream[W Word](dst []uint8, dstStride int, src []W, srcStride, count, bits int) error {
	if err := checkBits(bits); err != nil {
		return err
	}
	wb := uint(wordBits[W]())
	b := uint(bits)
	mask := uint64(1)<<b - 1
	var acc uint64
	var have uint
	i, s := 0, 0
	if srcStride == 1 && dstStride == 1 {
		switch in := any(src).(type) {
		case []uint8:
			i, s = unpackBytes(dst, in, count, bits)
		case []uint32:
			i, s = unpackWords(dst, in, count, bits)
		}
	}
	for d := i; i < count; i, d = i+1, d+dstStride {
		if have < b {
			acc |= uint64(src[s]) << have
			s += srcStride
			have += wb
		}
		dst[d] = uint8(acc & mask)
		acc >>= b
		have -= b
	}
	return nil
}

// unpackBytes is UnpackStream's fast path for contiguous bytes into contiguous codes, packBytes
// in reverse: bits bytes, read as one little-endian uint64, are spread into eight codes in three
// steps (halves, quarters, codes: each lane's upper part shifted up to the next lane). It unpacks
// whole groups of eight while a uint64 read stays inside src, and returns how many codes and
// bytes it consumed.
func unpackBytes(dst, src []uint8, count, bits int) (i, s int) {
	b := uint(bits)
	codes := ^uint64(0) // the group's 8·bits bits
	if b < 8 {
		codes = uint64(1)<<(8*b) - 1
	}
	fours := uint64(1)<<(4*b) - 1
	pairs := 0x0000000100000001 * (uint64(1)<<(2*b) - 1)
	ones := 0x0001000100010001 * (uint64(1)<<b - 1)
	for ; i+8 <= count && i+8 <= len(dst) && s+8 <= len(src); i, s = i+8, s+bits {
		x := binary.LittleEndian.Uint64(src[s:]) & codes
		x = x&fours | (x>>(4*b)&fours)<<32
		x = x&pairs | (x>>(2*b)&pairs)<<16
		x = x&ones | (x>>b&ones)<<8
		binary.LittleEndian.PutUint64(dst[i:], x)
	}
	return i, s
}

// unpackWords is UnpackStream's fast path for contiguous 32-bit words into contiguous codes,
// packWords in reverse: bits words, written out as little-endian bytes, unpack into 32 codes
// (unpackBytes). It returns how many codes and words it consumed.
func unpackWords(dst []uint8, src []uint32, count, bits int) (i, s int) {
	var buf [40]byte // 4·bits bytes, and room for unpackBytes' last uint64 read
	for ; i+32 <= count && i+32 <= len(dst) && s+bits <= len(src); i, s = i+32, s+bits {
		for j := range bits {
			binary.LittleEndian.PutUint32(buf[4*j:], src[s+j])
		}
		unpackBytes(dst[i:i+32], buf[:], 32, bits)
	}
	return i, s
}

// AWQOrder is AutoAWQ's interleave for 4-bit GEMM words: nibble i of a word holds column
// 8c + AWQOrder[i] of its block of eight.
var AWQOrder = [8]int{0, 2, 4, 6, 1, 3, 5, 7}

// PackAWQ4 packs count 4-bit codes (count a multiple of 8), read from src[0], src[srcStride], …,
// into count/8 consecutive words with AutoAWQ's interleave: word c holds code 8c+AWQOrder[i]
// in bits [4i, 4i+4).
func PackAWQ4(dst []uint32, src []uint8, srcStride, count int) error {
	if count%8 != 0 {
		return fmt.Errorf("packing: AWQ packs whole words of 8 codes, got %d codes", count)
	}
	for c := 0; c < count/8; c++ {
		var w uint32
		for i, j := range AWQOrder {
			q := src[(8*c+j)*srcStride]
			if q > 15 {
				return fmt.Errorf("packing: code %d at index %d does not fit in 4 bits", q, 8*c+j)
			}
			w |= uint32(q) << (4 * i)
		}
		dst[c] = w
	}
	return nil
}

// UnpackAWQ4 is the inverse of PackAWQ4: it writes count codes to dst[0], dst[dstStride], … .
func UnpackAWQ4(dst []uint8, dstStride int, src []uint32, count int) error {
	if count%8 != 0 {
		return fmt.Errorf("packing: AWQ packs whole words of 8 codes, got %d codes", count)
	}
	for c := 0; c < count/8; c++ {
		w := src[c]
		for i, j := range AWQOrder {
			dst[(8*c+j)*dstStride] = uint8(w>>(4*i)) & 15
		}
	}
	return nil
}
