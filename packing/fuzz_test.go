package packing

import (
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// FuzzUnpack: every layout's reader, given packed tensors with corrupted bytes or shapes,
// returns an error or a tensor that validates — never a panic.
func FuzzUnpack(f *testing.F) {
	f.Add(uint8(0), uint8(0), uint8(0), []byte{1, 2, 3}, int16(0))
	f.Add(uint8(1), uint8(2), uint8(1), []byte{0xff}, int16(-1))
	f.Add(uint8(4), uint8(3), uint8(2), []byte{}, int16(7))
	formats := Names()
	schemes := []string{"int4-g128-asym", "int3-g32-sym", "int8-g128-sym", "int2-g64-asym", "nf4-g64", "bin-g32-asym", "fp8", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"}
	f.Fuzz(func(t *testing.T, fi, si, ri uint8, patch []byte, dim int16) {
		format, _ := Lookup(formats[int(fi)%len(formats)])
		s, _ := quant.ParseScheme(schemes[int(si)%len(schemes)])
		if format.Supports(s) != nil {
			return
		}
		qt := randomTensor(rand.New(rand.NewPCG(uint64(fi), uint64(si))), s, 24, 256, false)
		raws, err := format.Pack("m", qt)
		if err != nil {
			t.Fatal(err)
		}
		r := &raws[int(ri)%len(raws)]
		data := append([]byte(nil), r.Data...)
		for i, b := range patch {
			if len(data) > 0 {
				data[(i*7919)%len(data)] ^= b
			}
		}
		if len(patch)%5 == 4 && len(data) > 0 {
			data = data[:len(data)/2] // truncated
		}
		r.Data = data
		if dim != 0 && len(r.Shape) > 0 {
			r.Shape = append([]int(nil), r.Shape...)
			r.Shape[int(ri)%len(r.Shape)] += int(dim)
		}
		got, err := format.Unpack("m", byName(raws), metaFor(format, "m", qt))
		if err != nil {
			return
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("%s %s: Unpack returned an invalid tensor: %v", format.Name(), s, err)
		}
	})
}
