package quant

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

// TestConcatRowsRejoinsSplitRows: a tensor cut into row ranges and joined again is the tensor.
func TestConcatRowsRejoinsSplitRows(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, s := range []Scheme{{Bits: 4, GroupSize: 128}, {Bits: 3, GroupSize: 32, Sym: true}, {Bits: 8, GroupSize: PerChannel},
		{Bits: 4, GroupSize: 64, Sym: true, Grid: NF4}, {Bits: 1, GroupSize: 16, Grid: Binary}} {
		for _, act := range []bool{false, true} {
			if act && s.GroupSize == PerChannel {
				continue
			}
			whole := randomValidTensor(r, s, 11, 256, act)
			var parts []*Tensor
			for _, rows := range [][2]int{{0, 3}, {3, 4}, {4, 11}} {
				parts = append(parts, rowsOf(whole, rows[0], rows[1]))
			}
			got, err := ConcatRows(parts)
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			if !reflect.DeepEqual(got, whole) {
				t.Errorf("%s act-order %v: joined rows differ from the tensor", s, act)
			}
		}
	}
}

func TestConcatRowsRefusesMismatches(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	a := randomValidTensor(r, Scheme{Bits: 4, GroupSize: 128}, 4, 256, true)
	b := randomValidTensor(r, Scheme{Bits: 4, GroupSize: 128}, 4, 256, true) // another column order
	if _, err := ConcatRows([]*Tensor{a, b}); err == nil {
		t.Error("joined parts with different act-order permutations")
	}
	c := randomValidTensor(r, Scheme{Bits: 3, GroupSize: 128}, 4, 256, false)
	a.GIdx = nil
	if _, err := ConcatRows([]*Tensor{a, c}); err == nil {
		t.Error("joined parts of different schemes")
	}
	nv := &Tensor{Scheme: Scheme{Bits: 4, GroupSize: 16, Grid: NVFP4}, N: 1, K: 16}
	if _, err := ConcatRows([]*Tensor{nv}); err == nil {
		t.Error("joined NVFP4 rows, whose global scale is tensor-wide")
	}
}

// rowsOf copies rows [r0, r1) of t.
func rowsOf(t *Tensor, r0, r1 int) *Tensor {
	ng := len(t.Scales) / t.N
	p := &Tensor{Scheme: t.Scheme, N: r1 - r0, K: t.K, GIdx: t.GIdx}
	p.Codes = append(p.Codes, t.Codes[r0*t.K:r1*t.K]...)
	p.Scales = append(p.Scales, t.Scales[r0*ng:r1*ng]...)
	if t.Zeros != nil {
		p.Zeros = append(p.Zeros, t.Zeros[r0*ng:r1*ng]...)
	}
	if t.Offsets != nil {
		p.Offsets = append(p.Offsets, t.Offsets[r0*ng:r1*ng]...)
	}
	return p
}
