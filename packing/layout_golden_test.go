package packing

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// The expected tensors below are built from docs/reference/formats.md's descriptions with specWords (a
// bit-by-bit loop) or explicit index formulas, never with the packers.

func word(r Raw, i int) uint32  { return binary.LittleEndian.Uint32(r.Data[4*i:]) }
func half(r Raw, i int) float32 { return fp.F16ToF32(binary.LittleEndian.Uint16(r.Data[2*i:])) }

func rawsByName(raws []Raw) map[string]Raw {
	m := map[string]Raw{}
	for _, r := range raws {
		m[r.Name] = r
	}
	return m
}

func TestGPTQLayoutGolden(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, v2 := range []bool{false, true} {
		for _, bits := range []int{2, 3, 4, 8} {
			for _, sym := range []bool{true, false} {
				s := quant.Scheme{Grid: quant.Integer, Bits: bits, GroupSize: 32, Sym: sym}
				n, k := 40, 96
				x := randomTensor(rng, s, n, k, false)
				if !sym {
					x.Zeros[0] = 0 // the v1 wrap-around case
				}
				raws, err := GPTQ{V2: v2}.Pack("p", x)
				if err != nil {
					t.Fatal(err)
				}
				m := rawsByName(raws)
				rows, ng := k*bits/32, 3
				for c := range n {
					col := specWords(x.Codes[c*k:(c+1)*k], bits)
					for r := range rows {
						if got := word(m["p.qweight"], r*n+c); got != col[r] {
							t.Fatalf("v2=%v %s qweight[%d][%d] = %08x, want %08x", v2, s, r, c, got, col[r])
						}
					}
				}
				zw := (n*bits + 31) / 32
				for g := range ng {
					stored := make([]uint8, n)
					for c := range n {
						z := int(x.Zeros[c*ng+g])
						if !v2 {
							z = (z - 1 + 256) % (1 << bits) // AutoGPTQ's zeros −= 1, kept to b bits
						}
						stored[c] = uint8(z)
					}
					want := specWords(stored, bits)
					for w := range zw {
						if got := word(m["p.qzeros"], g*zw+w); got != want[w] {
							t.Fatalf("v2=%v %s qzeros[%d][%d] = %08x, want %08x", v2, s, g, w, got, want[w])
						}
					}
					for c := range n {
						if got := half(m["p.scales"], g*n+c); got != x.Scales[c*ng+g] {
							t.Fatalf("scales[%d][%d] = %g, want %g", g, c, got, x.Scales[c*ng+g])
						}
					}
				}
				for kk := range k {
					if got := word(m["p.g_idx"], kk); got != uint32(kk/32) {
						t.Fatalf("g_idx[%d] = %d, want %d", kk, got, kk/32)
					}
				}
			}
		}
	}
}

func TestGPTQSymmetricZeroWords(t *testing.T) {
	// docs/reference/formats.md §1.3: the v1 packed qzeros of symmetric schemes are constants.
	want := map[int]uint32{2: 0x55555555, 4: 0x77777777, 8: 0x7F7F7F7F}
	rng := rand.New(rand.NewPCG(23, 24))
	for bits, w := range want {
		x := randomTensor(rng, quant.Scheme{Grid: quant.Integer, Bits: bits, GroupSize: 128, Sym: true}, 64, 256, false)
		raws, err := GPTQ{}.Pack("p", x)
		if err != nil {
			t.Fatal(err)
		}
		z := rawsByName(raws)["p.qzeros"]
		for i := range len(z.Data) / 4 {
			if word(z, i) != w {
				t.Fatalf("%d-bit qzeros word %d = %08x, want %08x", bits, i, word(z, i), w)
			}
		}
	}
}

func TestAWQLayoutGolden(t *testing.T) {
	rev := [8]int{0, 4, 1, 5, 2, 6, 3, 7} // column 8c+j at shift 4·rev[j]
	rng := rand.New(rand.NewPCG(25, 26))
	s := quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 32}
	n, k, ng := 24, 64, 2
	x := randomTensor(rng, s, n, k, false)
	raws, err := AWQ{}.Pack("p", x)
	if err != nil {
		t.Fatal(err)
	}
	m := rawsByName(raws)
	interleaved := func(at func(col int) uint8, c int) uint32 {
		var w uint32
		for j := range 8 {
			w |= uint32(at(8*c+j)) << (4 * rev[j])
		}
		return w
	}
	for kk := range k {
		for c := range n / 8 {
			want := interleaved(func(col int) uint8 { return x.Codes[col*k+kk] }, c)
			if got := word(m["p.qweight"], kk*n/8+c); got != want {
				t.Fatalf("qweight[%d][%d] = %08x, want %08x", kk, c, got, want)
			}
		}
	}
	for g := range ng {
		for c := range n / 8 {
			want := interleaved(func(col int) uint8 { return x.Zeros[col*ng+g] }, c)
			if got := word(m["p.qzeros"], g*n/8+c); got != want {
				t.Fatalf("qzeros[%d][%d] = %08x, want %08x", g, c, got, want)
			}
		}
		for c := range n {
			if half(m["p.scales"], g*n+c) != x.Scales[c*ng+g] {
				t.Fatalf("scales[%d][%d] wrong", g, c)
			}
		}
	}
}

func TestCompressedTensorsLayoutGolden(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 28))
	for _, bits := range []int{2, 4, 8} {
		s := quant.Scheme{Grid: quant.Integer, Bits: bits, GroupSize: 32}
		n, k, ng := 20, 70, 3
		x := randomTensor(rng, s, n, k, false)
		raws, err := CompressedTensors{}.Pack("p", x)
		if err != nil {
			t.Fatal(err)
		}
		m := rawsByName(raws)
		kw := (k*bits + 31) / 32
		for r := range n {
			want := specWords(x.Codes[r*k:(r+1)*k], bits)
			for w := range kw {
				if got := word(m["p.weight_packed"], r*kw+w); got != want[w] {
					t.Fatalf("%d-bit weight_packed[%d][%d] = %08x, want %08x", bits, r, w, got, want[w])
				}
			}
		}
		for g := range ng {
			col := make([]uint8, n)
			for r := range n {
				col[r] = x.Zeros[r*ng+g]
			}
			want := specWords(col, bits)
			for w := range want {
				if got := word(m["p.weight_zero_point"], w*ng+g); got != want[w] {
					t.Fatalf("%d-bit weight_zero_point[%d][%d] = %08x, want %08x", bits, w, g, got, want[w])
				}
			}
		}
		shape := m["p.weight_shape"]
		if shape.DType != "I64" || binary.LittleEndian.Uint64(shape.Data) != uint64(n) || binary.LittleEndian.Uint64(shape.Data[8:]) != uint64(k) {
			t.Fatalf("weight_shape %v %v", shape.DType, shape.Data)
		}
	}
}

// docs/reference/formats.md §3.1: symmetric 4-bit weight_packed is GPTQ's qweight transposed.
func TestCompressedTensorsIsTransposedGPTQ(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 30))
	x := randomTensor(rng, quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 128, Sym: true}, 48, 256, false)
	g, err := GPTQ{}.Pack("p", x)
	if err != nil {
		t.Fatal(err)
	}
	c, err := CompressedTensors{}.Pack("p", x)
	if err != nil {
		t.Fatal(err)
	}
	qw, wp := rawsByName(g)["p.qweight"], rawsByName(c)["p.weight_packed"]
	if _, ok := rawsByName(c)["p.weight_zero_point"]; ok {
		t.Fatal("symmetric compressed-tensors wrote zero points")
	}
	for r := range 32 {
		for n := range 48 {
			if word(qw, r*48+n) != word(wp, n*32+r) {
				t.Fatalf("qweight[%d][%d] != weight_packed[%d][%d]", r, n, n, r)
			}
		}
	}
}

func TestQPackLayoutGolden(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	s := quant.Scheme{Grid: quant.Integer, Bits: 3, GroupSize: 8}
	n, k, ng := 3, 21, 3
	x := randomTensor(rng, s, n, k, false)
	raws, err := QPack{}.Pack("p", x)
	if err != nil {
		t.Fatal(err)
	}
	m := rawsByName(raws)
	if got := (QPack{}).Metadata("p", x)["qpack.scheme.p"]; got != "int3-g8-asym" {
		t.Fatalf("scheme metadata %q", got)
	}
	bitAt := func(data []byte, i int) uint8 { return data[i/8] >> (i % 8) & 1 }
	codes, zeros := m["p.qpack_codes"], m["p.qpack_zeros"]
	if codes.Shape[1] != 8 || zeros.Shape[1] != 2 { // ⌈21·3/8⌉, ⌈3·3/8⌉
		t.Fatalf("shapes %v %v", codes.Shape, zeros.Shape)
	}
	for r := range n {
		row := codes.Data[r*8 : (r+1)*8]
		for kk := range k {
			var q uint8
			for b := range 3 {
				q |= bitAt(row, 3*kk+b) << b
			}
			if q != x.Codes[r*k+kk] {
				t.Fatalf("code [%d][%d] = %d, want %d", r, kk, q, x.Codes[r*k+kk])
			}
		}
		for i := 3 * k; i < 64; i++ {
			if bitAt(row, i) != 0 {
				t.Fatalf("padding bit %d of row %d is set", i, r)
			}
		}
		for g := range ng {
			var z uint8
			for b := range 3 {
				z |= bitAt(zeros.Data[r*2:], 3*g+b) << b
			}
			if z != x.Zeros[r*ng+g] {
				t.Fatalf("zero [%d][%d] = %d, want %d", r, g, z, x.Zeros[r*ng+g])
			}
		}
	}
}
