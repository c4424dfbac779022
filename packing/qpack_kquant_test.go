package packing

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/quanttest"
	"github.com/qpack-dev/qpack/quant"
)

func TestQPackKQuantRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	f := QPack{}
	for _, s := range quant.KQuantSchemes() {
		kt, _ := s.KQuant()
		for _, k := range []int{256, 320, 4096} {
			const n = 5
			qt := quanttest.RandomKQuant(rng, s, n, k)
			raws, err := f.Pack("m", qt)
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			var total int64
			shapes := map[string][]int{}
			for _, r := range raws {
				total += int64(len(r.Data))
				shapes[strings.TrimPrefix(r.Name, "m.")] = r.Shape
			}
			if got := f.Bytes(s, n, k); got != total {
				t.Errorf("%s K=%d: Bytes = %d, Pack wrote %d", s, k, got, total)
			}
			blocks, subBytes := (k+255)/256, (k/kt.Sub*kt.ScaleBits+7)/8
			want := map[string][]int{"qpack_shape": {2}, "qpack_codes": {n, (k*s.Bits + 7) / 8},
				"qpack_scales": {n, blocks}, "qpack_subscales": {n, subBytes}}
			if kt.Mins {
				want["qpack_mins"], want["qpack_submins"] = []int{n, blocks}, []int{n, subBytes}
			}
			if len(shapes) != len(want) {
				t.Errorf("%s: stored %v, want %v", s, shapes, want)
			}
			for name, shape := range want {
				if !slices.Equal(shapes[name], shape) {
					t.Errorf("%s K=%d: %s has shape %v, want %v", s, k, name, shapes[name], shape)
				}
			}
			got, err := f.Unpack("m", byName(raws), metaFor(f, "m", qt))
			if err != nil {
				t.Fatalf("%s K=%d: %v", s, k, err)
			}
			sameTensor(t, got, qt)
		}
	}
}

// With whole super-blocks a k-quant costs what ggml's blocks cost, to the bit.
func TestQPackKQuantBitsPerWeight(t *testing.T) {
	want := map[string]float64{"q2_k": 2.625, "q3_k": 3.4375, "q4_k": 4.5, "q5_k": 5.5, "q6_k": 6.5625}
	for _, s := range quant.KQuantSchemes() {
		const n, k = 8, 4096
		bpw := float64(8*(QPack{}.Bytes(s, n, k)-16)) / (n * k)
		if bpw != want[s.String()] {
			t.Errorf("%s: %v bits per weight, ggml's is %v", s, bpw, want[s.String()])
		}
	}
}

// The stored sub-block scales, checked byte by byte: q3_k's are +32 in 6 bits, q6_k's are the
// int8 bytes, q2_k's mins 4-bit.
func TestQPackKQuantStoredScales(t *testing.T) {
	q3, _ := quant.ParseScheme("q3_k")
	qt := quant.NewKQuantTensor(q3, 1, 64) // 4 sub-blocks: 24 bits
	copy(qt.SubScales, []int8{-32, 31, 0, -1})
	raws, err := QPack{}.Pack("m", qt)
	if err != nil {
		t.Fatal(err)
	}
	// Stored 0, 63, 32, 31 as 6-bit fields from bit 0 up: byte 0 = 0 | (63 & 3)<<6, byte 1 =
	// 63>>2 | (32 & 15)<<4, byte 2 = 32>>4 | 31<<2.
	if r, _ := byName(raws)("m.qpack_subscales"); string(r.Data) != "\xc0\x0f\x7e" {
		t.Errorf("q3_k sub-block scales stored as % x, want c0 0f 7e", r.Data)
	}
	q6, _ := quant.ParseScheme("q6_k")
	qt = quant.NewKQuantTensor(q6, 1, 32)
	copy(qt.SubScales, []int8{-1, -128})
	raws, _ = QPack{}.Pack("m", qt)
	if r, _ := byName(raws)("m.qpack_subscales"); string(r.Data) != "\xff\x80" {
		t.Errorf("q6_k sub-block scales stored as % x, want ff 80", r.Data)
	}
	q2, _ := quant.ParseScheme("q2_k")
	qt = quant.NewKQuantTensor(q2, 1, 32)
	copy(qt.SubMins, []uint8{15, 2})
	raws, _ = QPack{}.Pack("m", qt)
	if r, _ := byName(raws)("m.qpack_submins"); string(r.Data) != "\x2f" {
		t.Errorf("q2_k sub-block mins stored as % x, want 2f", r.Data)
	}
}

// Lying or damaged k-quant modules are refused with the tensor's name, never a panic.
func TestQPackKQuantLies(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	q4, _ := quant.ParseScheme("q4_k")
	qt := quanttest.RandomKQuant(rng, q4, 3, 320)
	f := QPack{}
	raws, err := f.Pack("m", qt)
	if err != nil {
		t.Fatal(err)
	}
	get := byName(raws)
	raw := func(name string) Raw { r, _ := get(name); return r }
	resized := func(name string, shape ...int) Raw {
		r := raw(name)
		r.Shape = shape
		return r
	}
	nanD := raw("m.qpack_scales")
	nanD.Data = append([]byte(nil), nanD.Data...)
	nanD.Data[3] = 0x7e // F16 0x7e.. is a NaN
	cases := []struct {
		get  func(string) (Raw, bool)
		want string
	}{
		{without(get, "m.qpack_subscales"), "m.qpack_subscales is missing"},
		{without(get, "m.qpack_mins"), "m.qpack_mins is missing"},
		{without(get, "m.qpack_submins"), "m.qpack_submins is missing"},
		{replacing(get, resized("m.qpack_subscales", 3, 7)), "m.qpack_subscales: shape [3 7], want [3 8]"},
		{replacing(get, resized("m.qpack_scales", 3, 1)), "m.qpack_scales: shape [3 1], want [3 2]"},
		{replacing(get, resized("m.qpack_codes", 3, 161)), "m.qpack_codes: shape [3 161], want [3 160]"},
		{replacing(get, Raw{Name: "m.qpack_mins", DType: "F32", Shape: []int{3, 2}, Data: make([]byte, 24)}), "m.qpack_mins: dtype F32, want F16"},
		{replacing(get, shapeRaw("m.qpack_shape", 3, 336)), "tensor m: K = 336 is not a multiple of q4_k's sub-block of 32"},
		{replacing(get, shapeRaw("m.qpack_shape", 4, 320)), "m.qpack_codes: shape [3 160], want [4 160]"},
		{replacing(get, nanD), "tensor m: super-block scale NaN at row 0, super-block 1"},
		{replacing(get, int32sRaw("m.qpack_g_idx", make([]int32, 320))), "has no act-order"},
	}
	for _, c := range cases {
		_, err := f.Unpack("m", c.get, metaFor(f, "m", qt))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want an error containing %q", err, c.want)
		}
	}
}

func TestOtherFormatsRefuseKQuants(t *testing.T) {
	for _, s := range quant.KQuantSchemes() {
		for _, name := range []string{"gptq", "gptq_v2", "awq", "compressed-tensors"} {
			f, _ := Lookup(name)
			if err := f.Supports(s); err == nil || !strings.Contains(err.Error(), "use format qpack") {
				t.Errorf("%s.Supports(%s) = %v, want a refusal naming format qpack", name, s, err)
			}
		}
		if err := (QPack{}).Supports(s); err != nil {
			t.Errorf("qpack refuses %s: %v", s, err)
		}
	}
}
