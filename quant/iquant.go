package quant

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
)

// IQ quants are llama.cpp's "importance" formats (ggml-common.h, ggml-quants.c). The lattice
// types code groups of Dim weights jointly: a group's magnitudes are one point of a fixed grid
// (the E8 lattice's shells for IQ2, a D4-like grid for IQ3, a ternary grid for IQ1; the tables in
// iqgrids.go), its signs a byte per 8 weights. IQ4_NL and IQ4_XS code each weight alone as one of
// 16 non-uniform values. A block of Block weights has an F16 scale d; sub-blocks of Sub weights
// have an integer scale sc (except IQ4_NL). Each weight w stands for
//
//	iq2_xxs, iq2_xs, iq2_s:  ±((d·(0.5 + sc))·0.25)·g    g the grid byte (8, 25, 43, …)
//	iq3_xxs:                 ±((d·(0.5 + sc))·0.5)·g
//	iq3_s:                   ±(d·(1 + 2·sc))·g
//	iq1_s, iq1_m:            (d·(2·sc + 1))·(g + δ)      g ∈ {−1, 0, 1}, δ = ±1/8
//	iq4_nl:                  d·v[q]                      v = IQ4Values
//	iq4_xs:                  (d·sc)·v[q]                 sc ∈ −32…31
//
// computed in float32 in this order, exactly as ggml's dequantize_row_iqX does.

// IQType names one IQ format (Scheme.IQ); IQNone for every other grid.
type IQType uint8

const (
	IQNone IQType = iota
	IQ4NL
	IQ4XS
	IQ3XXS
	IQ3S
	IQ2XXS
	IQ2XS
	IQ2S
	IQ1S
	IQ1M
)

// IQFormat holds the facts of one IQ type (ggml-common.h's block structs).
type IQFormat struct {
	Type       IQType
	Name       string // scheme name, e.g. "iq2_xxs"
	Bits       int    // nominal code width (Scheme.Bits): 4, 3, 2 or 1
	Block      int    // weights per ggml block (one F16 d): 256, or 32 for iq4_nl
	BlockBytes int    // bytes per ggml block
	Sub        int    // weights per sub-block scale (Scheme.GroupSize); 32 for iq4_nl, which has none
	ScaleLo    int    // range of the sub-block scale sc
	ScaleHi    int
	Dim        int  // weights per grid point; 0 for iq4_nl and iq4_xs (a 4-bit code per weight)
	GridSize   int  // number of grid points
	Parity     bool // each 8 weights have an even number of negative signs (7 are stored)
	SignGroup  int  // weights per Signs byte: 8, or the weights sharing one δ for iq1_s (32) and iq1_m (8)
	Imatrix    bool // ggml refuses to quantize it without an importance matrix
}

var iqFormats = map[IQType]IQFormat{
	IQ4NL:  {Type: IQ4NL, Name: "iq4_nl", Bits: 4, Block: 32, BlockBytes: 18, Sub: 32},
	IQ4XS:  {Type: IQ4XS, Name: "iq4_xs", Bits: 4, Block: 256, BlockBytes: 136, Sub: 32, ScaleLo: -32, ScaleHi: 31},
	IQ3XXS: {Type: IQ3XXS, Name: "iq3_xxs", Bits: 3, Block: 256, BlockBytes: 98, Sub: 32, ScaleHi: 15, Dim: 4, GridSize: 256, Parity: true, SignGroup: 8},
	IQ3S:   {Type: IQ3S, Name: "iq3_s", Bits: 3, Block: 256, BlockBytes: 110, Sub: 32, ScaleHi: 15, Dim: 4, GridSize: 512, SignGroup: 8},
	IQ2XXS: {Type: IQ2XXS, Name: "iq2_xxs", Bits: 2, Block: 256, BlockBytes: 66, Sub: 32, ScaleHi: 15, Dim: 8, GridSize: 256, Parity: true, SignGroup: 8, Imatrix: true},
	IQ2XS:  {Type: IQ2XS, Name: "iq2_xs", Bits: 2, Block: 256, BlockBytes: 74, Sub: 16, ScaleHi: 15, Dim: 8, GridSize: 512, Parity: true, SignGroup: 8, Imatrix: true},
	IQ2S:   {Type: IQ2S, Name: "iq2_s", Bits: 2, Block: 256, BlockBytes: 82, Sub: 16, ScaleHi: 15, Dim: 8, GridSize: 1024, SignGroup: 8},
	IQ1S:   {Type: IQ1S, Name: "iq1_s", Bits: 1, Block: 256, BlockBytes: 50, Sub: 32, ScaleHi: 7, Dim: 8, GridSize: 2048, SignGroup: 32, Imatrix: true},
	IQ1M:   {Type: IQ1M, Name: "iq1_m", Bits: 1, Block: 256, BlockBytes: 56, Sub: 16, ScaleHi: 7, Dim: 8, GridSize: 2048, SignGroup: 8},
}

// IQ4Values are IQ4_NL's and IQ4_XS's 16 code values (ggml's kvalues_iq4nl).
var IQ4Values = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// IQ1Delta is the shift δ of IQ1_S and IQ1_M groups (ggml's IQ1S_DELTA and IQ1M_DELTA).
const IQ1Delta = 0.125

// IQTypes lists the IQ types, widest first.
func IQTypes() []IQType {
	return []IQType{IQ4NL, IQ4XS, IQ3S, IQ3XXS, IQ2S, IQ2XS, IQ2XXS, IQ1M, IQ1S}
}

func (t IQType) String() string {
	if f, ok := iqFormats[t]; ok {
		return f.Name
	}
	return fmt.Sprintf("IQType(%d)", int(t))
}

// Format returns the facts of t; ok is false for IQNone and unknown values.
func (t IQType) Format() (f IQFormat, ok bool) {
	f, ok = iqFormats[t]
	return f, ok
}

// BitsPerWeight is the size of t's ggml blocks per weight, e.g. 2.0625 for iq2_xxs.
func (f IQFormat) BitsPerWeight() float64 { return float64(8*f.BlockBytes) / float64(f.Block) }

// IQuantScheme returns the scheme of IQ type t.
func IQuantScheme(t IQType) (Scheme, error) {
	f, ok := t.Format()
	if !ok {
		return Scheme{}, fmt.Errorf("unknown IQ type %d", int(t))
	}
	return Scheme{Grid: IQuant, IQ: t, Bits: f.Bits, GroupSize: f.Sub, Sym: true}, nil
}

// IQuant returns the facts of an IQ scheme; ok is false for any other scheme.
func (s Scheme) IQuant() (f IQFormat, ok bool) {
	if s.Grid != IQuant {
		return IQFormat{}, false
	}
	return s.IQ.Format()
}

func (s Scheme) validateIQuant() error {
	want, err := IQuantScheme(s.IQ)
	if err != nil {
		return fmt.Errorf("scheme %s: %w", s, err)
	}
	if s != want {
		return fmt.Errorf("scheme %s: fixed code width %d and sub-blocks of %d (%d and %d given)", want, want.Bits, want.GroupSize, s.Bits, s.GroupSize)
	}
	return nil
}

// parseIQuant reads "iq2_xxs", "iq4_nl", …; parts are the name's "-"-separated parts.
func parseIQuant(name string, parts []string) (Scheme, error) {
	for _, t := range IQTypes() {
		if t.String() != parts[0] {
			continue
		}
		s, _ := IQuantScheme(t)
		if len(parts) > 1 {
			return Scheme{}, fmt.Errorf("scheme %q: %s has fixed blocks and takes no group size or symmetry", name, s)
		}
		return s, nil
	}
	names := make([]string, 0, len(iqFormats))
	for _, t := range IQTypes() {
		names = append(names, t.String())
	}
	return Scheme{}, fmt.Errorf("scheme %q: unknown IQ type %q (want one of %s)", name, parts[0], strings.Join(names, ", "))
}

// NewIQuantTensor returns an n×k tensor of IQ scheme s with every slice allocated and zeroed (a
// valid tensor of zero weights when k is a multiple of the block).
func NewIQuantTensor(s Scheme, n, k int) *Tensor {
	f, _ := s.IQuant()
	t := &Tensor{Scheme: s, N: n, K: k, Scales: make([]float32, n*k/f.Block)}
	if f.ScaleHi > 0 {
		t.SubScales = make([]int8, n*k/f.Sub)
	}
	if f.Dim == 0 {
		t.Codes = make([]uint8, n*k)
		return t
	}
	t.Points = make([]uint16, n*k/f.Dim)
	t.Signs = make([]uint8, n*k/f.SignGroup)
	return t
}

// validateIQuant is Validate for an IQ tensor: whole blocks, no act-order, the slice lengths,
// finite block scales, sub-block scales in range, grid points on the grid, sign bytes with
// even parity where the format stores 7 of 8 signs, and δ signs of 0 or 1.
func (t *Tensor) validateIQuant() error {
	f, _ := t.Scheme.IQuant()
	if t.K%f.Block != 0 {
		return fmt.Errorf("%s: K = %d is not a multiple of its block of %d", t.Scheme, t.K, f.Block)
	}
	if t.GIdx != nil {
		return fmt.Errorf("%s: IQ quants have no act-order group index (g_idx)", t.Scheme)
	}
	subs, codes, points, signs := 0, t.N*t.K, 0, 0
	if f.ScaleHi > 0 {
		subs = t.N * t.K / f.Sub
	}
	if f.Dim > 0 {
		codes, points, signs = 0, t.N*t.K/f.Dim, t.N*t.K/f.SignGroup
	}
	for _, c := range []struct {
		what      string
		got, want int
	}{{"codes", len(t.Codes), codes}, {"scales (d)", len(t.Scales), t.N * t.K / f.Block}, {"sub-block scales", len(t.SubScales), subs},
		{"grid points", len(t.Points), points}, {"signs", len(t.Signs), signs},
		{"zeros", len(t.Zeros), 0}, {"offsets", len(t.Offsets), 0}, {"mins", len(t.Mins), 0}, {"sub-block mins", len(t.SubMins), 0}} {
		if err := checkLen(c.what, c.got, c.want); err != nil {
			return err
		}
	}
	if err := t.validateCodes(); err != nil {
		return err
	}
	return t.validateIQuantParams(f)
}

func (t *Tensor) validateIQuantParams(f IQFormat) error {
	blocks := t.K / f.Block
	for i, d := range t.Scales {
		if math.IsInf(float64(d), 0) || d != d {
			return fmt.Errorf("block scale %g at row %d, block %d is not finite", d, i/blocks, i%blocks)
		}
	}
	subs := t.K / f.Sub
	for i, sc := range t.SubScales {
		if int(sc) < f.ScaleLo || int(sc) > f.ScaleHi {
			return fmt.Errorf("sub-block scale %d at row %d, sub-block %d is outside %s's %d…%d", sc, i/subs, i%subs, t.Scheme, f.ScaleLo, f.ScaleHi)
		}
	}
	if f.Dim == 0 {
		return nil
	}
	for i, p := range t.Points {
		if int(p) >= f.GridSize {
			return fmt.Errorf("grid point %d at row %d, column %d is outside %s's grid of %d", p, i*f.Dim/t.K, i*f.Dim%t.K, t.Scheme, f.GridSize)
		}
	}
	for i, s := range t.Signs {
		row, col := i*f.SignGroup/t.K, i*f.SignGroup%t.K
		switch {
		case f.Parity && bits.OnesCount8(s)%2 != 0:
			return fmt.Errorf("signs %#x at row %d, column %d: %s stores 7 of 8 signs and needs an even number of minus signs", s, row, col, t.Scheme)
		case f.Bits == 1 && s > 1:
			return fmt.Errorf("delta sign %d at row %d, column %d is not 0 or 1", s, row, col)
		}
	}
	return nil
}

// IQSubScale is the float32 factor of a sub-block with scale sc in a block with scale d, as
// ggml's dequantize_row_iqX computes it.
func (f IQFormat) IQSubScale(d float32, sc int8) float32 {
	switch f.Type {
	case IQ4NL:
		return d
	case IQ4XS:
		return d * float32(sc)
	case IQ3XXS:
		return float32(d*(0.5+float32(sc))) * 0.5
	case IQ3S:
		return d * float32(1+2*int(sc))
	case IQ1S, IQ1M:
		return d * float32(2*int(sc)+1)
	}
	return float32(d*(0.5+float32(sc))) * 0.25
}

// GridPoint returns point p of t's grid, coordinate j in byte j: the stored magnitude (8, 25,
// 43, … for IQ2; 4, 12, … or 1, 3, … for IQ3), or −1, 0, 1 as int8 bytes for IQ1.
func (t IQType) GridPoint(p uint16) uint64 {
	switch t {
	case IQ2XXS:
		return iq2xxsGrid[p]
	case IQ2XS:
		return iq2xsGrid[p]
	case IQ2S:
		return iq2sGrid[p]
	case IQ3XXS:
		return uint64(iq3xxsGrid[p])
	case IQ3S:
		return uint64(iq3sGrid[p])
	case IQ1S, IQ1M:
		return iq1sGrid[p]
	}
	panic(fmt.Sprintf("quant: %s has no grid", t))
}

// dequantizeIQRow writes row n of an IQ tensor to out (len K), sub-block by sub-block.
func (t *Tensor) dequantizeIQRow(out []float32, n int) {
	s := t.Scheme
	f, _ := s.IQuant()
	blocks, subs := t.K/f.Block, t.K/f.Sub
	for j := range subs {
		lo := j * f.Sub
		d := t.Scales[n*blocks+lo/f.Block]
		var sc int8
		if t.SubScales != nil {
			sc = t.SubScales[n*subs+j]
		}
		dl := f.IQSubScale(d, sc)
		o := out[lo : lo+f.Sub]
		switch {
		case f.Dim == 0:
			for i, q := range t.Codes[n*t.K+lo : n*t.K+lo+f.Sub] {
				o[i] = dl * float32(IQ4Values[q])
			}
		case f.Bits == 1:
			t.dequantizeIQ1(o, f, dl, n*t.K+lo)
		default:
			t.dequantizeLattice(o, f, dl, n*t.K+lo)
		}
	}
}

// dequantizeLattice writes the values of the sub-block of IQ2/IQ3 weights starting at flat
// index at (row·K + column) with factor dl.
func (t *Tensor) dequantizeLattice(o []float32, f IQFormat, dl float32, at int) {
	for g := 0; g < len(o); g += f.Dim {
		point := f.Type.GridPoint(t.Points[(at+g)/f.Dim])
		signs := t.Signs[(at+g)/8] >> ((at + g) % 8)
		for j := range f.Dim {
			o[g+j] = latticeValue(dl, point, j, signs>>j&1 != 0)
		}
	}
}

// dequantizeIQ1 is dequantizeLattice for IQ1: dl·(g + δ).
func (t *Tensor) dequantizeIQ1(o []float32, f IQFormat, dl float32, at int) {
	for g := 0; g < len(o); g += f.Dim {
		point := f.Type.GridPoint(t.Points[(at+g)/f.Dim])
		neg := t.Signs[(at+g)/f.SignGroup] != 0
		for j := range f.Dim {
			o[g+j] = IQ1Value(dl, point, j, neg)
		}
	}
}

// latticeValue is coordinate j of an IQ2/IQ3 point (its stored magnitude) at factor dl, negated
// when neg: ±(dl·g).
func latticeValue(dl float32, point uint64, j int, neg bool) float32 {
	v := dl * float32(uint8(point>>(8*j)))
	if neg {
		return -v
	}
	return v
}

// IQ1Value is coordinate j (−1, 0 or 1) of an IQ1 point at factor dl with δ = −1/8 when neg, else
// +1/8: dl·(g + δ).
func IQ1Value(dl float32, point uint64, j int, neg bool) float32 {
	delta := float32(IQ1Delta)
	if neg {
		delta = -delta
	}
	return dl * (float32(int8(point>>(8*j))) + delta)
}

// IQFactor returns the factor of the sub-block holding weight (n, col) of an IQ tensor.
func (t *Tensor) IQFactor(n, col int) float32 {
	f, _ := t.Scheme.IQuant()
	e := n*t.K + col
	var sc int8
	if t.SubScales != nil {
		sc = t.SubScales[e/f.Sub]
	}
	return f.IQSubScale(t.Scales[e/f.Block], sc)
}

// IQValue returns the value of weight (n, col) of an IQ tensor, as Dequantize computes it.
func (t *Tensor) IQValue(n, col int) float32 {
	f, _ := t.Scheme.IQuant()
	e, dl := n*t.K+col, t.IQFactor(n, col)
	switch {
	case f.Dim == 0:
		return dl * float32(IQ4Values[t.Codes[e]])
	case f.Bits == 1:
		return IQ1Value(dl, f.Type.GridPoint(t.Points[e/f.Dim]), e%f.Dim, t.Signs[e/f.SignGroup] != 0)
	}
	return latticeValue(dl, f.Type.GridPoint(t.Points[e/f.Dim]), e%f.Dim, t.Signs[e/8]>>(e%8)&1 != 0)
}
