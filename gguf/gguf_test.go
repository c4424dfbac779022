package gguf

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	parser "github.com/gpustack/gguf-parser-go"
)

func constTensor(name string, t Type, dims []uint64, data []byte) Tensor {
	return Tensor{Name: name, Type: t, Dims: dims, WriteTo: func(w io.Writer) error { _, err := w.Write(data); return err }}
}

func allKVs() []KV {
	return []KV{
		{"general.architecture", "llama"},
		{"t.u8", uint8(200)}, {"t.i8", int8(-5)}, {"t.u16", uint16(60000)}, {"t.i16", int16(-300)},
		{"t.u32", uint32(4000000000)}, {"t.i32", int32(-7)}, {"t.f32", float32(1.5)}, {"t.bool", true},
		{"t.str", "héllo"}, {"t.u64", uint64(1) << 40}, {"t.i64", int64(-1) << 40}, {"t.f64", 2.25},
		{"t.astr", []string{"a", "", "ccc"}}, {"t.ai32", []int32{1, -2, 3}}, {"t.af32", []float32{0.5}},
		{"t.abool", []bool{true, false}}, {"t.au8", []uint8{}},
		{"t.nested", []any{[]int32{1, 2}, []int32{3}}},
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	a := make([]byte, 4*3*5) // F32 [3, 5]
	for i := range a {
		a[i] = byte(i)
	}
	q := make([]byte, 34*2) // Q8_0 [64, 1]
	q[0], q[1] = 0x00, 0x3c
	tensors := []Tensor{constTensor("a.weight", F32, []uint64{3, 5}, a), constTensor("b.weight", Q8_0, []uint64{64, 1}, q)}
	if err := Write(path, allKVs(), tensors); err != nil {
		t.Fatal(err)
	}
	g, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if !reflect.DeepEqual(g.KVs, allKVs()) {
		t.Fatalf("KVs read back differ:\n%v\n%v", g.KVs, allKVs())
	}
	if g.DataOffset%32 != 0 || g.Tensors[0].Offset != 0 || g.Tensors[1].Offset != 64 {
		t.Fatalf("data at %d, offsets %d %d; want a multiple of 32, 0, 64 (60 padded)", g.DataOffset, g.Tensors[0].Offset, g.Tensors[1].Offset)
	}
	for i, want := range [][]byte{a, q} {
		got, err := g.Bytes(g.Tensors[i])
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("tensor %d bytes differ (%v)", i, err)
		}
	}
	st, _ := os.Stat(path)
	if st.Size() != g.DataOffset+64+96 {
		t.Fatalf("file size %d, want %d (each tensor padded to 32)", st.Size(), g.DataOffset+64+96)
	}

	// The second oracle: gguf-parser-go reads the same header, offsets and values.
	pf, err := parser.ParseGGUFFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if pf.TensorDataStartOffset != g.DataOffset || len(pf.TensorInfos) != 2 || pf.TensorInfos[1].Offset != 64 ||
		pf.TensorInfos[1].Type != parser.GGMLTypeQ8_0 || !reflect.DeepEqual(pf.TensorInfos[0].Dimensions, []uint64{3, 5}) {
		t.Fatalf("gguf-parser-go: data at %d, tensors %+v", pf.TensorDataStartOffset, pf.TensorInfos)
	}
	kv, ok := pf.Header.MetadataKV.Get("t.astr")
	if !ok || !reflect.DeepEqual(kv.ValueArray().Array, []any{"a", "", "ccc"}) {
		t.Fatalf("gguf-parser-go: t.astr = %+v", kv)
	}
	if kv, _ := pf.Header.MetadataKV.Get("t.f64"); kv.ValueFloat64() != 2.25 {
		t.Fatalf("gguf-parser-go: t.f64 = %v", kv.Value)
	}
	if kv, _ := pf.Header.MetadataKV.Get("t.i64"); kv.ValueInt64() != -1<<40 {
		t.Fatalf("gguf-parser-go: t.i64 = %v", kv.Value)
	}
}

func TestWriteRefusesBadTensors(t *testing.T) {
	long := strings.Repeat("x", 64)
	cases := map[string][]Tensor{
		"must be 1 to 63 bytes":     {constTensor(long, F32, []uint64{1}, make([]byte, 4))},
		"appears twice":             {constTensor("a", F32, []uint64{1}, make([]byte, 4)), constTensor("a", F32, []uint64{1}, make([]byte, 4))},
		"not a multiple of Q4_0":    {constTensor("a", Q4_0, []uint64{48, 1}, make([]byte, 36))},
		"wrote 3 bytes":             {constTensor("a", F32, []uint64{1}, make([]byte, 3))},
		"has no GGUF type":          nil,
		"unknown ggml type 99":      {constTensor("a", Type(99), []uint64{1}, nil)},
		"5 dimensions (GGUF allows": {constTensor("a", F32, []uint64{1, 1, 1, 1, 1}, make([]byte, 4))},
	}
	for want, tensors := range cases {
		dir := t.TempDir()
		kvs := []KV{{"general.architecture", "llama"}}
		if tensors == nil {
			kvs = append(kvs, KV{"bad", []int{1}})
		}
		err := Write(filepath.Join(dir, "m.gguf"), kvs, tensors)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want an error containing %q, got %v", want, err)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("%q: a failed write left %v", want, left[0].Name())
		}
	}
}

// TestWriteModeFollowsUmask: a GGUF file is readable by others under umask 022 (0644), like
// every other output, so an ollama service running as another user can load it.
func TestWriteModeFollowsUmask(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := Write(path, []KV{{"general.architecture", "llama"}}, []Tensor{constTensor("a", F32, []uint64{1}, make([]byte, 4))}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, want 0644", fi.Mode().Perm())
	}
}

func TestOpenRefusesWrongOffsetsAndTruncation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	tensors := []Tensor{constTensor("a", F32, []uint64{3}, make([]byte, 12)), constTensor("b", F32, []uint64{1}, make([]byte, 4))}
	if err := Write(path, nil, tensors); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	// The second tensor info's offset is the last 8 bytes before the padding: it must be 32.
	i := bytes.LastIndex(b[:64*2], []byte{32, 0, 0, 0, 0, 0, 0, 0})
	bad := bytes.Clone(b)
	binary.LittleEndian.PutUint64(bad[i:], 16)
	os.WriteFile(path, bad, 0o644)
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "has offset 16, expected 32") {
		t.Fatalf("wrong offset: %v", err)
	}
	for _, n := range []int{0, 3, 20, len(b) - 1} {
		os.WriteFile(path, b[:n], 0o644)
		if _, err := Open(path); err == nil {
			t.Fatalf("file truncated to %d bytes was accepted", n)
		}
	}
}

// The decoders below are written from ggml-common.h's block structs and dequantize_row_*,
// byte by byte, independent of quants.go.

func half(b []byte) float64 {
	h := uint16(b[0]) | uint16(b[1])<<8
	sign, exp, frac := h>>15, int(h>>10&31), float64(h&1023)
	var v float64
	switch exp {
	case 0:
		v = frac / 1024 * math.Pow(2, -14)
	case 31:
		v = math.Inf(1)
	default:
		v = (1 + frac/1024) * math.Pow(2, float64(exp-15))
	}
	if sign == 1 {
		v = -v
	}
	return v
}

// oracleDecode returns the values of one block and its scale d (for the error bound).
func oracleDecode(t Type, b []byte) (vals []float64, d float64) {
	switch t {
	case Q8_0: // struct { ggml_half d; int8_t qs[32]; }
		d = half(b[0:2])
		for j := 0; j < 32; j++ {
			vals = append(vals, float64(int8(b[2+j]))*d)
		}
	case Q4_0, Q4_1, Q5_0, Q5_1:
		d = half(b[0:2])
		m, pos, offset := 0.0, 2, 8.0
		if t == Q4_1 || t == Q5_1 { // ggml_half m follows d
			m, pos, offset = half(b[2:4]), 4, 0
		}
		var qh uint32
		if t == Q5_0 || t == Q5_1 { // uint8_t qh[4]: bit j is the fifth bit of element j
			qh = uint32(b[pos]) | uint32(b[pos+1])<<8 | uint32(b[pos+2])<<16 | uint32(b[pos+3])<<24
			pos += 4
			if t == Q5_0 {
				offset = 16
			}
		}
		vals = make([]float64, 32)
		for j := 0; j < 16; j++ { // byte j: element j in the low nibble, element j+16 in the high
			lo := int(b[pos+j]%16) + int((qh>>uint(j))%2)*16
			hi := int(b[pos+j]/16) + int((qh>>uint(j+16))%2)*16
			vals[j] = (float64(lo)-offset)*d + m
			vals[j+16] = (float64(hi)-offset)*d + m
		}
	}
	return vals, math.Abs(d)
}

func randomRows(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 0.05)
		if i%97 == 0 {
			x[i] *= 20 // outliers
		}
	}
	for i := 64; i < 96; i++ {
		x[i] = 0 // an all-zero block: d = 0 must decode to zeros
	}
	return x
}

func TestEncodeMatchesIndependentDecoder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	x := randomRows(r, 384*3)
	for _, typ := range []Type{Q8_0, Q4_0, Q4_1, Q5_0, Q5_1} {
		enc, err := Encode(nil, typ, x)
		if err != nil {
			t.Fatal(err)
		}
		if len(enc) != typ.RowBytes(len(x)) {
			t.Fatalf("%s: %d bytes, want %d", typ, len(enc), typ.RowBytes(len(x)))
		}
		ours, err := Decode(nil, typ, enc)
		if err != nil {
			t.Fatal(err)
		}
		levels := map[Type]float64{Q8_0: 127, Q4_0: 8, Q4_1: 15, Q5_0: 16, Q5_1: 31}[typ]
		var sq, norm float64
		for b := 0; b < len(x)/32; b++ {
			vals, d := oracleDecode(typ, enc[b*typ.TypeSize():])
			for j, v := range vals {
				i := 32*b + j
				if float32(v) != ours[i] {
					t.Fatalf("%s element %d: Decode %g, independent decoder %g", typ, i, ours[i], v)
				}
				// Error: half a step, plus the rounding of d (and m) to f16; Q4_0/Q5_0 clip the
				// far side of the largest value by one step.
				bound := d*1.0001 + math.Abs(float64(x[i]))/1024 + 1e-7
				if typ == Q8_0 || typ == Q4_1 || typ == Q5_1 {
					bound = d*0.5001 + math.Abs(float64(x[i]))/1024 + d*levels/1024 + 1e-7
				}
				if e := math.Abs(v - float64(x[i])); e > bound {
					t.Fatalf("%s element %d: %g decoded as %g (error %g > %g)", typ, i, x[i], v, e, bound)
				}
				sq += (v - float64(x[i])) * (v - float64(x[i]))
				norm += float64(x[i]) * float64(x[i])
			}
		}
		t.Logf("%s: relative RMS error %.4f", typ, math.Sqrt(sq/norm))
	}
}

// Hand-computed blocks from the reference formulas: the nibble order and the sign of d.
func TestEncodeKnownBlocks(t *testing.T) {
	x := make([]float32, 32)
	x[0] = -8 // max = −8, d = max/−8 = 1: element 0 → 0, the rest → trunc(0 + 8.5) = 8
	got, _ := Encode(nil, Q4_0, x)
	want := append([]byte{0x00, 0x3c, 0x80}, bytes.Repeat([]byte{0x88}, 15)...)
	if !bytes.Equal(got, want) {
		t.Fatalf("Q4_0 block % x, want % x", got, want)
	}
	x[0], x[17] = 0, 16 // Q5_0: max 16, d = −1; element 17 → trunc(−16+16.5) = 0, the rest 16
	got, _ = Encode(nil, Q5_0, x)
	// d = −1 (f16 0xbc00); qh: bit j set for every element but 17; nibbles all 0.
	want = append([]byte{0x00, 0xbc, 0xff, 0xff, 0xfd, 0xff}, make([]byte, 16)...)
	if !bytes.Equal(got, want) {
		t.Fatalf("Q5_0 block % x, want % x", got, want)
	}
	x[17] = 0
	x[3] = -2.54 // Q8_0: d = 0.02, q = round(−127) at 3, 0 elsewhere
	got, _ = Encode(nil, Q8_0, x)
	if got[2+3] != 0x81 || !bytes.Equal(got[2:5], []byte{0, 0, 0}) || half(got[:2]) != float64(float32(2.54/127)) && math.Abs(half(got[:2])-0.02) > 1e-5 {
		t.Fatalf("Q8_0 block % x", got)
	}
}

func TestEncodeRefusesNonFiniteAndPartialBlocks(t *testing.T) {
	if _, err := Encode(nil, Q8_0, make([]float32, 48)); err == nil || !strings.Contains(err.Error(), "not whole Q8_0 blocks") {
		t.Fatalf("48 values: %v", err)
	}
	x := make([]float32, 32)
	x[5] = float32(math.NaN())
	if _, err := Encode(nil, Q4_0, x); err == nil || !strings.Contains(err.Error(), "value 5") {
		t.Fatalf("NaN: %v", err)
	}
}
