package packing

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

type roundTripCase struct {
	s        quant.Scheme
	n, k     int
	actOrder bool
}

func intSchemes(bits []int, groups []int) []quant.Scheme {
	var out []quant.Scheme
	for _, b := range bits {
		for _, g := range groups {
			for _, sym := range []bool{true, false} {
				out = append(out, quant.Scheme{Grid: quant.Integer, Bits: b, GroupSize: g, Sym: sym})
			}
		}
	}
	return out
}

var (
	fp4Schemes      = []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme}
	fp8BlockSchemes = []quant.Scheme{quant.FP8BlockScheme(8), quant.FP8BlockScheme(128)}
)

// casesFor lists awkward but legal sizes for each format.
func casesFor(f Format) []roundTripCase {
	var cases []roundTripCase
	add := func(schemes []quant.Scheme, sizes [][2]int, actOrder bool) {
		for _, s := range schemes {
			for _, nk := range sizes {
				cases = append(cases, roundTripCase{s, nk[0], nk[1], actOrder && s.GroupSize != quant.PerChannel})
			}
		}
	}
	switch f.(type) {
	case GPTQ:
		// K·b a multiple of 32; N anything (qzeros rows are padded).
		add(intSchemes([]int{2, 4, 8}, []int{32, 128, quant.PerChannel}), [][2]int{{5, 64}, {33, 160}, {1, 16}}, false)
		add(intSchemes([]int{3}, []int{32, 128, quant.PerChannel}), [][2]int{{5, 96}, {33, 160}, {7, 32}}, false)
		add(intSchemes([]int{2, 3, 4, 8}, []int{32}), [][2]int{{11, 96}, {3, 224}}, true)
	case AWQ:
		add([]quant.Scheme{{Grid: quant.Integer, Bits: 4, GroupSize: 32}, {Grid: quant.Integer, Bits: 4, GroupSize: 64},
			{Grid: quant.Integer, Bits: 4, GroupSize: quant.PerChannel}}, [][2]int{{8, 64}, {24, 192}, {136, 64}}, false)
		add([]quant.Scheme{{Grid: quant.Integer, Bits: 4, GroupSize: quant.PerChannel}}, [][2]int{{16, 37}, {8, 5}}, false) // K not a multiple of 8
	case CompressedTensors:
		add(intSchemes([]int{2, 4, 8}, []int{8, 32, 128, quant.PerChannel}), [][2]int{{5, 37}, {33, 160}, {1, 3}, {17, 129}}, false)
		add(intSchemes([]int{2, 4, 8}, []int{32}), [][2]int{{9, 100}}, true)
		add(fp4Schemes, [][2]int{{5, 64}, {1, 32}, {17, 160}}, false)
	case FP8Block:
		add(fp8BlockSchemes, [][2]int{{5, 37}, {33, 160}, {130, 200}, {1, 1}}, false)
	case QPack:
		schemes := intSchemes([]int{2, 3, 4, 5, 6, 7, 8}, []int{8, 32, quant.PerChannel})
		schemes = append(schemes,
			quant.Scheme{Grid: quant.NF4, Bits: 4, GroupSize: 64, Sym: true},
			quant.Scheme{Grid: quant.NF4, Bits: 4, GroupSize: quant.PerChannel, Sym: true},
			quant.Scheme{Grid: quant.FP8E4M3, Bits: 8, GroupSize: quant.PerChannel, Sym: true},
			quant.Scheme{Grid: quant.Binary, Bits: 1, GroupSize: 16, Sym: true},
			quant.Scheme{Grid: quant.Binary, Bits: 1, GroupSize: 24, Sym: false},
			quant.Scheme{Grid: quant.Binary, Bits: 1, GroupSize: quant.PerChannel, Sym: false})
		add(schemes, [][2]int{{5, 37}, {1, 1}, {13, 130}}, false)
		add(schemes, [][2]int{{6, 75}}, true)
		add(fp4Schemes, [][2]int{{5, 64}, {1, 32}, {17, 160}}, false)
		add(fp8BlockSchemes, [][2]int{{5, 37}, {130, 200}}, false)
	}
	return cases
}

func TestRoundTripEveryFormat(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, name := range Names() {
		f, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		cases := casesFor(f)
		if len(cases) == 0 {
			t.Fatalf("no round-trip cases for %s", name)
		}
		for _, c := range cases {
			label := fmt.Sprintf("%s/%s/%dx%d/actorder=%v", name, c.s, c.n, c.k, c.actOrder)
			prefix := "model.layers.3.mlp.up_proj"
			want := randomTensor(rng, c.s, c.n, c.k, c.actOrder)
			raws, err := f.Pack(prefix, want)
			if err != nil {
				t.Fatalf("%s: pack: %v", label, err)
			}
			var stored int64
			for _, r := range raws {
				if !strings.HasPrefix(r.Name, prefix+".") || !containsName(f.TensorNames(prefix), r.Name) {
					t.Fatalf("%s: wrote %s, not among TensorNames", label, r.Name)
				}
				if err := r.expect(r.DType, r.Shape...); err != nil {
					t.Fatalf("%s: %v", label, err)
				}
				if !strings.HasSuffix(r.Name, "g_idx") || name == "gptq" || name == "gptq_v2" {
					stored += int64(len(r.Data))
				}
			}
			if b := f.Bytes(c.s, c.n, c.k); b != stored {
				t.Fatalf("%s: Bytes says %d, Pack stored %d", label, b, stored)
			}
			got, err := f.Unpack(prefix, byName(raws), metaFor(f, prefix, want))
			if err != nil {
				t.Fatalf("%s: unpack: %v", label, err)
			}
			sameTensor(t, got, want)
		}
	}
}

func containsName(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

func TestSupportsNamesAnAlternative(t *testing.T) {
	cases := []struct {
		format, scheme, want string
	}{
		{"gptq", "nf4-g64", "qpack"},
		{"gptq", "bin-g128-sym", "qpack"},
		{"gptq_v2", "fp8", "qpack"},
		{"awq", "int4-g128-sym", "gptq"},
		{"awq", "int8-g128-asym", "gptq"},
		{"compressed-tensors", "int3-g128-sym", "gptq"},
		{"compressed-tensors", "nf4-g64", "qpack"},
		{"gptq", "int6-g128-asym", "qpack"},
		{"compressed-tensors", "int5-g128-sym", "qpack"},
		{"compressed-tensors", "fp8-b128", "qpack"},
		{"gptq", "nvfp4", "qpack"},
		{"awq", "mxfp4", "qpack"},
		{"fp8", "int4-g128-asym", "qpack"},
		{"fp8", "nvfp4", "qpack"},
	}
	for _, c := range cases {
		f, _ := Lookup(c.format)
		s, err := quant.ParseScheme(c.scheme)
		if err != nil {
			t.Fatal(err)
		}
		err = f.Supports(s)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s.Supports(%s) = %v, want an error naming %s", c.format, c.scheme, err, c.want)
		}
	}
	for _, name := range Names() {
		f, _ := Lookup(name)
		if name == "fp8" {
			continue // block FP8 only
		}
		if err := f.Supports(quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 128}); err != nil {
			t.Errorf("%s refuses int4-g128-asym: %v", name, err)
		}
	}
	if _, err := Lookup("gguf"); err == nil {
		t.Error("Lookup accepted an unknown format")
	}
}

func TestPackRejectsUnfitTensors(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	int4 := quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 32}
	prefix := "model.layers.0.self_attn.q_proj"
	cases := []struct {
		format string
		t      *quant.Tensor
		want   string
	}{
		{"gptq", randomTensor(rng, quant.Scheme{Grid: quant.Integer, Bits: 3, GroupSize: 32}, 4, 48, false), "multiple of 32"},
		{"gptq", randomTensor(rng, int4, 4, 36, false), "multiple of 8"},
		{"awq", randomTensor(rng, int4, 12, 64, false), "multiple of 8"},
		{"awq", randomTensor(rng, int4, 8, 64, true), "act-order"},
		{"gptq", func() *quant.Tensor { x := randomTensor(rng, int4, 4, 64, false); x.Codes[5] = 16; return x }(), "code"},
		{"qpack", func() *quant.Tensor { x := randomTensor(rng, int4, 4, 64, false); x.Scales = x.Scales[1:]; return x }(), "scales"},
		{"compressed-tensors", func() *quant.Tensor { x := randomTensor(rng, int4, 4, 64, false); x.Scales[0] = 0.1; return x }(), "F16"},
		{"qpack", nil, "nil"},
	}
	for _, c := range cases {
		f, _ := Lookup(c.format)
		_, err := f.Pack(prefix, c.t)
		if err == nil || !strings.Contains(err.Error(), prefix) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Pack error %v, want one naming %s and %q", c.format, err, prefix, c.want)
		}
	}
}

// TestUnpackRejectsCorruptInput damages one tensor of a good packing at a time.
func TestUnpackRejectsCorruptInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	prefix := "model.layers.1.mlp.down_proj"
	int4 := quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 32}
	schemes := map[string][]quant.Scheme{"compressed-tensors": {int4, quant.NVFP4Scheme, quant.MXFP4Scheme},
		"qpack": {int4, quant.NVFP4Scheme, quant.MXFP4Scheme, quant.FP8BlockScheme(32)}, "fp8": {quant.FP8BlockScheme(32)}}
	for _, name := range Names() {
		f, _ := Lookup(name)
		list, ok := schemes[name]
		if !ok {
			list = []quant.Scheme{int4}
		}
		for _, s := range list {
			unpackCorrupted(t, rng, f, prefix, s)
		}
	}
}

// unpackCorrupted packs a random tensor of scheme s with f, then damages its tensors one at a
// time: each damage must be an error naming the damaged tensor.
func unpackCorrupted(t *testing.T, rng *rand.Rand, f Format, prefix string, s quant.Scheme) {
	name := f.Name() + " " + s.String()
	{
		tensor := randomTensor(rng, s, 16, 64, false)
		raws, err := f.Pack(prefix, tensor)
		if err != nil {
			t.Fatal(err)
		}
		meta := metaFor(f, prefix, tensor)
		good := byName(raws)
		if _, err := f.Unpack(prefix, good, map[string]string{}); err == nil {
			t.Errorf("%s: unpacked without a scheme", name)
		}
		for _, r := range raws {
			if strings.HasSuffix(r.Name, "g_idx") {
				continue // optional in every reader
			}
			damaged := map[string]func(string) (Raw, bool){
				"missing":     without(good, r.Name),
				"wrong dtype": replacing(good, Raw{Name: r.Name, DType: "BF16", Shape: r.Shape, Data: r.Data}),
				"short data":  replacing(good, Raw{Name: r.Name, DType: r.DType, Shape: r.Shape, Data: r.Data[:len(r.Data)-1]}),
				"wrong shape": replacing(good, Raw{Name: r.Name, DType: r.DType, Shape: append([]int{1}, r.Shape...), Data: r.Data}),
			}
			for what, get := range damaged {
				_, err := f.Unpack(prefix, get, meta)
				if err == nil || !strings.Contains(err.Error(), r.Name) {
					t.Errorf("%s, %s %s: error %v, want one naming the tensor", name, what, r.Name, err)
				}
			}
		}
	}
}

func TestUnpackRejectsBadGroupIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	prefix := "model.layers.2.mlp.gate_proj"
	s := quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 32}
	tensor := randomTensor(rng, s, 8, 64, true)
	for _, name := range []string{"gptq", "compressed-tensors", "qpack"} {
		f, _ := Lookup(name)
		raws, err := f.Pack(prefix, tensor)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range raws {
			if strings.HasSuffix(r.Name, "g_idx") {
				bad := append([]byte(nil), r.Data...)
				bad[4*5] = 9 // group 9 of 2
				raws[i].Data = bad
			}
		}
		_, err = f.Unpack(prefix, byName(raws), metaFor(f, prefix, tensor))
		if err == nil || !strings.Contains(err.Error(), "g_idx") {
			t.Errorf("%s: bad g_idx gave %v", name, err)
		}
	}
}

// Dims reads [N, K] back from every layout without decoding, for awkward shapes.
func TestDimsEveryFormat(t *testing.T) {
	cases := []struct {
		format string
		scheme string
		n, k   int
	}{
		{"gptq", "int4-g128-asym", 24, 384}, {"gptq_v2", "int3-g32-sym", 40, 96}, {"awq", "int4-g64-asym", 16, 192},
		{"compressed-tensors", "int8-g128-sym", 7, 256}, {"qpack", "nf4-g64", 5, 200}, {"qpack", "bin-g128-asym", 3, 130},
	}
	for _, c := range cases {
		f, _ := Lookup(c.format)
		s, err := quant.ParseScheme(c.scheme)
		if err != nil {
			t.Fatal(err)
		}
		qt := randomTensor(rand.New(rand.NewPCG(1, uint64(c.n))), s, c.n, c.k, false)
		raws, err := f.Pack("m", qt)
		if err != nil {
			t.Fatalf("%s %s: %v", c.format, c.scheme, err)
		}
		n, k, err := f.Dims("m", byName(raws))
		if err != nil || n != c.n || k != c.k {
			t.Errorf("%s %s: Dims = %d, %d, %v; want %d, %d", c.format, c.scheme, n, k, err, c.n, c.k)
		}
		if _, _, err := f.Dims("absent", func(string) (Raw, bool) { return Raw{}, false }); err == nil {
			t.Errorf("%s: Dims of a missing module should fail", c.format)
		}
	}
}

// TestRoundTripLargeTensors: tensors large enough to be packed and unpacked over several
// goroutines (eachRows, when GOMAXPROCS allows) come back as they went, in the layouts that split
// their rows (AWQ its blocks of eight rows).
func TestRoundTripLargeTensors(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, f := range []Format{GPTQ{}, CompressedTensors{}, QPack{}, AWQ{}} {
		for _, bits := range []int{3, 4, 8} {
			s := quant.Scheme{Grid: quant.Integer, Bits: bits, GroupSize: 128}
			if f.Supports(s) != nil {
				continue
			}
			want := randomTensor(rng, s, 528, 4096, false)
			raws, err := f.Pack("p", want)
			if err != nil {
				t.Fatalf("%s %s: pack: %v", f.Name(), s, err)
			}
			got, err := f.Unpack("p", byName(raws), metaFor(f, "p", want))
			if err != nil {
				t.Fatalf("%s %s: unpack: %v", f.Name(), s, err)
			}
			sameTensor(t, got, want)
		}
	}
}

// TestAWQRejectsWideCodes: packAWQWeights refuses a code of 16 or more, in the eight channels at
// a time and in the channels past them.
func TestAWQRejectsWideCodes(t *testing.T) {
	for _, at := range []int{9*37 + 21, 9*37 + 35} {
		codes := make([]uint8, 16*37)
		codes[at] = 16
		if err := packAWQWeights(make([]uint32, 37*2), codes, 16, 37); err == nil {
			t.Errorf("a 5-bit code at %d packed", at)
		}
	}
}
