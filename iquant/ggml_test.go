package iquant

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// testdata/ggml.txt holds what libggml (llama.cpp c392e509, built for the CPU) gives on fixed
// pseudo-random inputs, recorded by a C program outside the repository that links it:
//
//	quant TYPE impV rowR BLOCKS VALUES   ggml_quantize_chunk of row R with importance V, then
//	                                     ggml's to_float of the blocks; "abort" where ggml
//	                                     aborts, "nonfinite" where it stores a NaN or Inf scale
//	decode TYPE BLOCKS VALUES            to_float of 64 pseudo-random blocks (finite d)
//
// BLOCKS and VALUES are the first 8 bytes of the SHA-256 of the block bytes and of the float32
// values (little-endian). The inputs are regenerated here by the same generator (fixtureRow,
// fixtureImportance, fixtureBlocks).

const (
	fixtureK        = 1024
	fixtureRows     = 16
	fixtureVariants = 5
	fixtureBlocks   = 64
)

// splitmix is the fixtures' generator (SplitMix64).
type splitmix uint64

func (s *splitmix) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

func (s *splitmix) unif() float64 { return float64(s.next()>>11) * 0x1p-53 }

// normalish is the sum of four uniforms minus 2 (variance 1/3), added left to right.
func (s *splitmix) normalish() float64 {
	a, b, c, d := s.unif(), s.unif(), s.unif(), s.unif()
	return a + b + c + d - 2
}

// fixtureRow is row kind r: normal-ish, heavy-tailed, one-signed, large negative, sparse,
// tiny, constant, zero, below IQ3's epsilon, zero sub-blocks (and a −0), outliers,
// BF16-rounded, negative constant, 7 of 8 negative, cubed, and below every epsilon but IQ2's.
func fixtureRow(r int) []float32 {
	s := splitmix(1000 + r)
	w := make([]float32, fixtureK)
	for i := range w {
		g := s.normalish()
		var v float64
		switch r {
		case 0, 11:
			v = 0.02 * g
		case 1:
			u := s.unif()
			v = 0.02 * g / math.Max(0.05, u)
		case 2:
			v = math.Abs(g)
		case 3:
			v = -100 * math.Abs(g)
		case 4:
			if s.unif() < 1.0/3 {
				v = g
			}
		case 5:
			v = 1e-6 * g
		case 6:
			v = 0.5
		case 8:
			v = 3e-9 * g
		case 9:
			if !(i >= 288 && i < 320 || i >= 528 && i < 544 || i >= 768 && i < 1016) {
				v = 0.02 * g
			}
		case 10:
			if s.unif() < 0.01 {
				v = 30 * g
			} else {
				v = 0.02 * g
			}
		case 12:
			v = -0.25
		case 13:
			v = 0.01 + 0.001*float64(i%5)
			if i%8 < 7 {
				v = -v
			}
		case 14:
			v = g * g * g
		case 15:
			v = 1e-20 * g
		}
		w[i] = float32(v)
		if r == 11 {
			w[i] = fp.BF16ToF32(fp.F32ToBF16(w[i]))
		}
	}
	if r == 9 {
		w[fixtureK-1] = float32(math.Copysign(0, -1))
	}
	return w
}

// fixtureImportance is importance variant v: none, random, one channel in 4 zero, a zero
// sub-block (columns 512…543), and a wide dynamic range.
func fixtureImportance(v int) []float32 {
	if v == 0 {
		return nil
	}
	s := splitmix(77 + v)
	imp := make([]float32, fixtureK)
	for i := range imp {
		u := s.unif()
		var x float64
		switch v {
		case 1:
			x = 0.01 + 4*u*u
		case 2:
			if i%4 != 1 {
				x = 0.01 + u
			}
		case 3:
			if i < 512 || i >= 544 {
				x = 0.5 + u
			}
		case 4:
			x = 1e-4 + 1000*u*u*u*u*u*u
		}
		imp[i] = float32(x)
	}
	return imp
}

func shortHash(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// ggmlFixtures reads testdata/ggml.txt into a map from "quant TYPE impV rowR" or "decode TYPE"
// to its hashes ("abort" for a refusal).
func ggmlFixtures(t *testing.T) map[string]string {
	f, err := os.Open("testdata/ggml.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		n := 4
		if fields[0] == "decode" {
			n = 2
		}
		m[strings.Join(fields[:n], " ")] = strings.Join(fields[n:], " ")
	}
	return m
}

// TestMatchesGGML quantizes every fixture row with every IQ type and importance variant and
// compares the blocks and their values with ggml's; where ggml aborts or stores a non-finite
// scale, QuantizeRow must fail.
func TestMatchesGGML(t *testing.T) {
	want := ggmlFixtures(t)
	for _, it := range quant.IQTypes() {
		s, _ := quant.IQuantScheme(it)
		typ, err := TypeOf(s)
		if err != nil {
			t.Logf("%s: %v", s, err)
			continue
		}
		for v := range fixtureVariants {
			imp := fixtureImportance(v)
			for r := range fixtureRows {
				key := fmt.Sprintf("quant %s imp%d row%d", s, v, r)
				exp, ok := want[key]
				if !ok {
					t.Fatalf("no fixture %q", key)
				}
				got, err := quantizeFixture(typ, fixtureRow(r), imp)
				switch {
				case err != nil && exp != "abort" && exp != "nonfinite":
					t.Errorf("%s: %v", key, err)
				case err == nil && got != exp:
					t.Errorf("%s: got %s, ggml %s", key, got, exp)
				}
			}
		}
	}
}

// quantizeFixture quantizes one row and returns the hashes of its blocks and values.
func quantizeFixture(typ *Type, w, imp []float32) (string, error) {
	q := quant.NewIQuantTensor(typ.Scheme, 1, len(w))
	if err := typ.QuantizeRow(q, 0, w, imp); err != nil {
		return "", err
	}
	blocks, err := AppendRows(nil, q)
	if err != nil {
		return "", err
	}
	return shortHash(blocks) + " " + shortHash(cuda.Bytes(q.Dequantize(nil))), nil
}

// fixtureTypes is the C program's type order, which seeds each type's decode blocks.
var fixtureTypes = []quant.IQType{quant.IQ4NL, quant.IQ4XS, quant.IQ3XXS, quant.IQ3S, quant.IQ2XXS, quant.IQ2XS, quant.IQ2S, quant.IQ1S, quant.IQ1M}

// fixtureData is the C program's pseudo-random blocks of type i of fixtureTypes, with d's bit
// 14 cleared so that d is finite.
func fixtureData(i int, f quant.IQFormat) []byte {
	s := splitmix(5000 + i)
	data := make([]byte, fixtureBlocks*f.BlockBytes)
	for j := range data {
		data[j] = uint8(s.next() >> 56)
	}
	for b := range fixtureBlocks {
		if f.Type == quant.IQ1M {
			data[(b+1)*f.BlockBytes-1] &= 0xbf // d's top nibble is the last scale word's
		} else {
			data[b*f.BlockBytes+1] &= 0xbf
		}
	}
	return data
}

// TestDecodeMatchesGGML decodes pseudo-random blocks of every type (every bit pattern is a
// valid block) and compares the values with ggml's dequantize_row_iqX; AppendRows must give
// the same bytes back.
func TestDecodeMatchesGGML(t *testing.T) {
	want := ggmlFixtures(t)
	for i, it := range fixtureTypes {
		s, _ := quant.IQuantScheme(it)
		f, _ := it.Format()
		data := fixtureData(i, f)
		q, err := Decode(s, data, 1, fixtureBlocks*f.Block)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		back, err := AppendRows(nil, q)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if !bytes.Equal(back, data) {
			t.Errorf("%s: AppendRows(Decode(blocks)) differs from the blocks", s)
		}
		got := shortHash(data) + " " + shortHash(cuda.Bytes(q.Dequantize(nil)))
		if exp := want["decode "+s.String()]; got != exp {
			t.Errorf("%s: decoded %s, ggml %s", s, got, exp)
		}
	}
}
