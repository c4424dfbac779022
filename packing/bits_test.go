package packing

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// specWords builds a packed bitstream bit by bit from the format description: bit t of code
// i is stream bit i·b+t, which is bit (i·b+t) mod 32 of word (i·b+t)/32.
func specWords(codes []uint8, bits int) []uint32 {
	words := make([]uint32, (len(codes)*bits+31)/32)
	for i, c := range codes {
		for t := range bits {
			if c>>t&1 == 1 {
				pos := i*bits + t
				words[pos/32] |= 1 << (pos % 32)
			}
		}
	}
	return words
}

func randomCodes(rng *rand.Rand, n, bits int) []uint8 {
	c := make([]uint8, n)
	for i := range c {
		c[i] = uint8(rng.IntN(1 << bits))
	}
	return c
}

func TestPackStreamMatchesSpec(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, bits := range []int{1, 2, 3, 4, 5, 6, 7, 8} {
		for _, count := range []int{1, 7, 31, 32, 33, 96, 100, 257} {
			codes := randomCodes(rng, count, bits)
			want := specWords(codes, bits)
			got := make([]uint32, PackedLen[uint32](count, bits))
			if err := PackStream(got, 1, codes, 1, count, bits); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%d-bit, %d codes: got %08x, want %08x", bits, count, got, want)
			}
			back := make([]uint8, count)
			if err := UnpackStream(back, 1, got, 1, count, bits); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(back, codes) {
				t.Fatalf("%d-bit, %d codes: unpacked %v, want %v", bits, count, back, codes)
			}
		}
	}
}

// autoGPTQ3Bit is AutoGPTQ's own 3-bit pack loop (qlinear_cuda_old.py, QuantLinear.pack),
// transcribed for one column: 10 codes, a straddling code, 10 codes, another, 10 codes.
func autoGPTQ3Bit(q []uint8) []uint32 {
	out := make([]uint32, len(q)*3/32)
	i, row := 0, 0
	for row < len(out) {
		for j := i; j < i+10; j++ {
			out[row] |= uint32(q[j]) << (3 * (j - i))
		}
		i += 10
		out[row] |= uint32(q[i]) << 30
		row++
		out[row] |= uint32(q[i]>>2) & 1
		i++
		for j := i; j < i+10; j++ {
			out[row] |= uint32(q[j]) << (3*(j-i) + 1)
		}
		i += 10
		out[row] |= uint32(q[i]) << 31
		row++
		out[row] |= uint32(q[i]>>1) & 3
		i++
		for j := i; j < i+10; j++ {
			out[row] |= uint32(q[j]) << (3*(j-i) + 2)
		}
		i += 10
		row++
	}
	return out
}

func TestPack3BitMatchesAutoGPTQLoop(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	codes := randomCodes(rng, 32*5, 3)
	got := make([]uint32, 15)
	if err := PackStream(got, 1, codes, 1, len(codes), 3); err != nil {
		t.Fatal(err)
	}
	if want := autoGPTQ3Bit(codes); !slices.Equal(got, want) {
		t.Fatalf("got %08x\nwant %08x", got, want)
	}
}

func TestPackStreamStridesAndBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, bits := range []int{1, 2, 3, 4, 5, 6, 7, 8} {
		const count, srcStride, dstStride = 45, 3, 2
		src := randomCodes(rng, count*srcStride, bits)
		codes := make([]uint8, count)
		for i := range codes {
			codes[i] = src[i*srcStride]
		}
		// 32-bit words at a stride: the same words as the contiguous stream.
		words := make([]uint32, PackedLen[uint32](count, bits)*dstStride)
		if err := PackStream(words, dstStride, src, srcStride, count, bits); err != nil {
			t.Fatal(err)
		}
		want := specWords(codes, bits)
		for w := range want {
			if words[w*dstStride] != want[w] {
				t.Fatalf("%d-bit word %d: %08x, want %08x", bits, w, words[w*dstStride], want[w])
			}
		}
		// Bytes: the little-endian bytes of the same stream.
		bytes := make([]uint8, PackedLen[uint8](count, bits))
		if err := PackStream(bytes, 1, codes, 1, count, bits); err != nil {
			t.Fatal(err)
		}
		for i, b := range bytes {
			if wantB := uint8(want[i/4] >> (8 * (i % 4))); b != wantB {
				t.Fatalf("%d-bit byte %d: %02x, want %02x", bits, i, b, wantB)
			}
		}
		back := make([]uint8, count*2)
		if err := UnpackStream(back, 2, bytes, 1, count, bits); err != nil {
			t.Fatal(err)
		}
		for i := range codes {
			if back[2*i] != codes[i] {
				t.Fatalf("%d-bit byte stream code %d: %d, want %d", bits, i, back[2*i], codes[i])
			}
		}
	}
}

// TestPackStreamBytesFastPath: contiguous codes into bytes (packBytes, eight codes at a time)
// give the spec's stream at every width and at lengths around its groups of eight, write no byte
// past the packed length, and report a code too wide by its index; unpackBytes gives the codes
// back and writes nothing past them.
func TestPackStreamBytesFastPath(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for bits := 1; bits <= 8; bits++ {
		for _, count := range []int{8, 15, 16, 17, 64, 129, 1000} {
			codes := randomCodes(rng, count, bits)
			want := specWords(codes, bits)
			n := PackedLen[uint8](count, bits)
			bytes := slices.Repeat([]uint8{0xAA}, n+9) // the bytes past n must stay as they are
			if err := PackStream(bytes, 1, codes, 1, count, bits); err != nil {
				t.Fatal(err)
			}
			for i, b := range bytes[:n] {
				if wantB := uint8(want[i/4] >> (8 * (i % 4))); b != wantB {
					t.Fatalf("%d-bit, %d codes: byte %d is %02x, want %02x", bits, count, i, b, wantB)
				}
			}
			if tail := bytes[n:]; slices.ContainsFunc(tail, func(b uint8) bool { return b != 0xAA }) {
				t.Fatalf("%d-bit, %d codes: bytes past the packed length changed: %02x", bits, count, tail)
			}
			back := slices.Repeat([]uint8{0xAA}, count+9) // unpackBytes, the general loop after it
			if err := UnpackStream(back, 1, bytes[:n], 1, count, bits); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(back[:count], codes) || slices.ContainsFunc(back[count:], func(b uint8) bool { return b != 0xAA }) {
				t.Fatalf("%d-bit, %d codes: unpacked %v, want %v and the rest untouched", bits, count, back, codes)
			}
		}
		if bits < 8 {
			codes := make([]uint8, 64)
			codes[41] = 1 << bits
			err := PackStream(make([]uint8, PackedLen[uint8](64, bits)), 1, codes, 1, 64, bits)
			if err == nil || !strings.Contains(err.Error(), "index 41") {
				t.Fatalf("%d-bit: a code of %d at index 41: %v", bits, codes[41], err)
			}
		}
	}
}

// TestPackStreamWordsFastPath: contiguous codes into 32-bit words (packWords, 32 codes at a
// time) give the spec's words at every width, leave the words past the packed length alone,
// unpack back (unpackWords), and report a code too wide by its index.
func TestPackStreamWordsFastPath(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for bits := 1; bits <= 8; bits++ {
		for _, count := range []int{32, 63, 64, 65, 200, 1024} {
			codes := randomCodes(rng, count, bits)
			n := PackedLen[uint32](count, bits)
			words := slices.Repeat([]uint32{0xAAAAAAAA}, n+3)
			if err := PackStream(words, 1, codes, 1, count, bits); err != nil {
				t.Fatal(err)
			}
			if want := specWords(codes, bits); !slices.Equal(words[:n], want) {
				t.Fatalf("%d-bit, %d codes: got %08x, want %08x", bits, count, words[:n], want)
			}
			if tail := words[n:]; slices.ContainsFunc(tail, func(w uint32) bool { return w != 0xAAAAAAAA }) {
				t.Fatalf("%d-bit, %d codes: words past the packed length changed: %08x", bits, count, tail)
			}
			back := slices.Repeat([]uint8{0xAA}, count+5)
			if err := UnpackStream(back, 1, words[:n], 1, count, bits); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(back[:count], codes) || slices.ContainsFunc(back[count:], func(b uint8) bool { return b != 0xAA }) {
				t.Fatalf("%d-bit, %d codes: unpacked %v, want %v and the rest untouched", bits, count, back, codes)
			}
		}
		if bits < 8 {
			codes := make([]uint8, 96)
			codes[41] = 1 << bits
			err := PackStream(make([]uint32, PackedLen[uint32](96, bits)), 1, codes, 1, 96, bits)
			if err == nil || !strings.Contains(err.Error(), "index 41") {
				t.Fatalf("%d-bit words: a code of %d at index 41: %v", bits, codes[41], err)
			}
		}
	}
}

func TestPackStreamRejectsBadInput(t *testing.T) {
	dst := make([]uint32, 4)
	if err := PackStream(dst, 1, []uint8{1, 16, 3}, 1, 3, 4); err == nil {
		t.Fatal("a 5-bit code packed as 4-bit")
	}
	long := make([]uint8, 16) // long enough for the 4-bit fast path
	long[13] = 17
	if err := PackStream(dst, 1, long, 1, 16, 4); err == nil || !strings.Contains(err.Error(), "index 13") {
		t.Fatalf("a 5-bit code in the fast path: %v", err)
	}
	if err := PackStream(dst, 1, []uint8{1}, 1, 1, 9); err == nil {
		t.Fatal("9-bit packing accepted")
	}
}

func TestAWQInterleave(t *testing.T) {
	// Columns 0..7 holding their own index: nibble i holds column AWQOrder[i], so reading the
	// nibbles from the top gives 7 5 3 1 6 4 2 0.
	var w [1]uint32
	if err := PackAWQ4(w[:], []uint8{0, 1, 2, 3, 4, 5, 6, 7}, 1, 8); err != nil {
		t.Fatal(err)
	}
	if w[0] != 0x75316420 {
		t.Fatalf("got %08x, want 75316420", w[0])
	}
	// The reverse description (docs/reference/formats.md §2.1): column 8c+j sits at shift 4·REV[j].
	rev := [8]int{0, 4, 1, 5, 2, 6, 3, 7}
	rng := rand.New(rand.NewPCG(7, 8))
	codes := randomCodes(rng, 64, 4)
	got := make([]uint32, 8)
	if err := PackAWQ4(got, codes, 1, 64); err != nil {
		t.Fatal(err)
	}
	for c := range 8 {
		var want uint32
		for j := range 8 {
			want |= uint32(codes[8*c+j]) << (4 * rev[j])
		}
		if got[c] != want {
			t.Fatalf("word %d: %08x, want %08x", c, got[c], want)
		}
	}
	back := make([]uint8, 64)
	if err := UnpackAWQ4(back, 1, got, 64); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, codes) {
		t.Fatal("AWQ unpack differs")
	}
}
