package quant

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// K-quants are llama.cpp's super-block formats Q2_K … Q6_K (ggml-common.h, ggml-quants.c). A
// row's weights form super-blocks of SuperBlock weights along K (the last one shorter when K is
// not a multiple of 256; GGUF cannot hold that), each made of sub-blocks of G = GroupSize
// weights. A super-block has an F16 scale d (and, for the types with mins, an F16 dmin); sub-block
// j has an integer scale sc_j (and min m_j). Code q of sub-block j stands for
//
//	with mins (q2_k, q4_k, q5_k):  w = (d·sc_j)·q − dmin·m_j
//	without (q3_k, q6_k):          w = (d·sc_j)·(q − o),  o = 4 (q3_k) or 32 (q6_k)
//
// computed in float32 in this order, exactly as ggml's dequantize_row_qX_K does, so that a
// tensor and its GGUF blocks dequantize to the same float32 values.

// SuperBlock is the number of weights of a whole k-quant super-block (ggml's QK_K).
const SuperBlock = 256

// KQuantType holds the facts of one k-quant scheme.
type KQuantType struct {
	Bits      int  // code width
	Sub       int  // weights per sub-block (the scheme's GroupSize)
	Mins      bool // sub-blocks have mins (dmin·m_j is subtracted); false: codes are offset
	Offset    int  // subtracted from a code before scaling (types without mins)
	ScaleLo   int  // smallest sub-block scale
	ScaleHi   int  // largest sub-block scale
	MinHi     int  // largest sub-block min (types with mins; the smallest is 0)
	ScaleBits int  // bits a sub-block scale (and min) occupies when stored: 4, 6 or 8
	// ScaleBias is added to a sub-block scale when it is stored in ScaleBits bits: 32 for q3_k
	// (ggml's bias), 0 otherwise (q6_k's int8 scales are stored as two's complement bytes).
	ScaleBias int
}

// kquantTypes are the five k-quant types by code width (ggml-common.h's block structs).
var kquantTypes = map[int]KQuantType{
	2: {Bits: 2, Sub: 16, Mins: true, ScaleHi: 15, MinHi: 15, ScaleBits: 4},
	3: {Bits: 3, Sub: 16, Offset: 4, ScaleLo: -32, ScaleHi: 31, ScaleBits: 6, ScaleBias: 32},
	4: {Bits: 4, Sub: 32, Mins: true, ScaleHi: 63, MinHi: 63, ScaleBits: 6},
	5: {Bits: 5, Sub: 32, Mins: true, ScaleHi: 63, MinHi: 63, ScaleBits: 6},
	6: {Bits: 6, Sub: 16, Offset: 32, ScaleLo: -128, ScaleHi: 127, ScaleBits: 8},
}

// KQuantScheme returns the k-quant scheme of the given code width (q2_k … q6_k).
func KQuantScheme(bits int) (Scheme, error) {
	kt, ok := kquantTypes[bits]
	if !ok {
		return Scheme{}, fmt.Errorf("k-quants have 2 to 6 bits (q2_k … q6_k), not %d", bits)
	}
	return Scheme{Grid: KQuant, Bits: bits, GroupSize: kt.Sub, Sym: !kt.Mins}, nil
}

// KQuantSchemes returns q2_k … q6_k, narrowest first.
func KQuantSchemes() []Scheme {
	out := make([]Scheme, 0, len(kquantTypes))
	for bits := 2; bits <= 6; bits++ {
		s, _ := KQuantScheme(bits)
		out = append(out, s)
	}
	return out
}

// KQuant returns the facts of a k-quant scheme; ok is false for any other scheme.
func (s Scheme) KQuant() (kt KQuantType, ok bool) {
	if s.Grid != KQuant {
		return KQuantType{}, false
	}
	kt, ok = kquantTypes[s.Bits]
	return kt, ok
}

// StoredScale is sub-block scale sc as stored in ScaleBits bits; LoadScale reverses it.
func (kt KQuantType) StoredScale(sc int8) uint8 { return uint8(int(sc) + kt.ScaleBias) }

// LoadScale is the sub-block scale a stored value stands for (the stored value must fit in
// ScaleBits bits).
func (kt KQuantType) LoadScale(v uint8) int8 { return int8(v - uint8(kt.ScaleBias)) }

// CheckRowLength says whether rows of k weights can be quantized with s: k-quants need whole
// sub-blocks, IQ types whole blocks (256 weights, 32 for iq4_nl), FP4 whole blocks; every other
// scheme takes any k.
func (s Scheme) CheckRowLength(k int) error {
	if kt, ok := s.KQuant(); ok && k%kt.Sub != 0 {
		return fmt.Errorf("%s needs rows of whole sub-blocks of %d weights, not K = %d", s, kt.Sub, k)
	}
	if f, ok := s.IQuant(); ok && k%f.Block != 0 {
		return fmt.Errorf("%s needs rows of whole blocks of %d weights, not K = %d", s, f.Block, k)
	}
	if s.IsFP4() && k%s.GroupSize != 0 {
		return fmt.Errorf("%s needs rows of whole blocks of %d weights, not K = %d", s, s.GroupSize, k)
	}
	return nil
}

// SuperBlocks is the number of k-quant super-blocks of a row of k weights.
func (s Scheme) SuperBlocks(k int) int { return (k + SuperBlock - 1) / SuperBlock }

func (s Scheme) validateKQuant() error {
	want, err := KQuantScheme(s.Bits)
	if err != nil {
		return fmt.Errorf("scheme %s: %w", s, err)
	}
	if s != want {
		return fmt.Errorf("scheme %s: sub-blocks of %d, mins %v (group size %d, sym %v given)", s, want.GroupSize, !want.Sym, s.GroupSize, s.Sym)
	}
	return nil
}

// parseKQuant reads "q2_k" … "q6_k"; parts are the name's "-"-separated parts.
func parseKQuant(name string, parts []string) (Scheme, error) {
	bits, err := strconv.Atoi(strings.TrimSuffix(parts[0][1:], "_k"))
	if err != nil {
		return Scheme{}, fmt.Errorf("scheme %q: unknown grid %q (want q2_k … q6_k)", name, parts[0])
	}
	s, err := KQuantScheme(bits)
	if err != nil {
		return Scheme{}, fmt.Errorf("scheme %q: %w", name, err)
	}
	if len(parts) > 1 {
		return Scheme{}, fmt.Errorf("scheme %q: %s has fixed sub-blocks of %d and takes no group size or symmetry", name, s, s.GroupSize)
	}
	return s, nil
}

// NewKQuantTensor returns an n×k tensor of k-quant scheme s with every slice allocated and
// zeroed (a valid tensor of zero weights when k is a multiple of the sub-block).
func NewKQuantTensor(s Scheme, n, k int) *Tensor {
	kt, _ := s.KQuant()
	blocks, subs := n*s.SuperBlocks(k), n*s.Groups(k)
	t := &Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k), Scales: make([]float32, blocks), SubScales: make([]int8, subs)}
	if kt.Mins {
		t.Mins = make([]float32, blocks)
		t.SubMins = make([]uint8, subs)
	}
	return t
}

// validateKQuant is Validate for a k-quant tensor: whole sub-blocks, no act-order, the slice
// lengths, codes, finite super-block scales and sub-block scales and mins in range.
func (t *Tensor) validateKQuant() error {
	s := t.Scheme
	kt, _ := s.KQuant()
	if t.K%kt.Sub != 0 {
		return fmt.Errorf("%s: K = %d is not a multiple of its sub-block of %d", s, t.K, kt.Sub)
	}
	if t.GIdx != nil {
		return fmt.Errorf("%s: k-quants have no act-order group index (g_idx)", s)
	}
	blocks, subs, minBlocks, minSubs := t.N*s.SuperBlocks(t.K), t.N*t.K/kt.Sub, 0, 0
	if kt.Mins {
		minBlocks, minSubs = blocks, subs
	}
	for _, c := range []struct {
		what      string
		got, want int
	}{{"codes", len(t.Codes), t.N * t.K}, {"scales (d)", len(t.Scales), blocks}, {"mins (dmin)", len(t.Mins), minBlocks},
		{"sub-block scales", len(t.SubScales), subs}, {"sub-block mins", len(t.SubMins), minSubs},
		{"zeros", len(t.Zeros), 0}, {"offsets", len(t.Offsets), 0}} {
		if err := checkLen(c.what, c.got, c.want); err != nil {
			return err
		}
	}
	if err := t.validateCodes(); err != nil {
		return err
	}
	return t.validateKQuantParams(kt)
}

func (t *Tensor) validateKQuantParams(kt KQuantType) error {
	blocks, subs := t.Scheme.SuperBlocks(t.K), t.K/kt.Sub
	for _, v := range [][]float32{t.Scales, t.Mins} {
		for i, x := range v {
			if math.IsInf(float64(x), 0) || x != x {
				return fmt.Errorf("super-block scale %g at row %d, super-block %d is not finite", x, i/blocks, i%blocks)
			}
		}
	}
	for i, sc := range t.SubScales {
		if int(sc) < kt.ScaleLo || int(sc) > kt.ScaleHi {
			return fmt.Errorf("sub-block scale %d at row %d, sub-block %d is outside %s's %d…%d", sc, i/subs, i%subs, t.Scheme, kt.ScaleLo, kt.ScaleHi)
		}
	}
	for i, m := range t.SubMins {
		if int(m) > kt.MinHi {
			return fmt.Errorf("sub-block min %d at row %d, sub-block %d is outside %s's 0…%d", m, i/subs, i%subs, t.Scheme, kt.MinHi)
		}
	}
	return nil
}

// SubBlock returns the two float32 factors of a sub-block with scale sc and min m in a
// super-block with d and dmin, as ggml computes them: dl = d·sc and ml = dmin·m.
func (kt KQuantType) SubBlock(d, dmin float32, sc int8, m uint8) (dl, ml float32) {
	return d * float32(sc), dmin * float32(m)
}

// Value is the weight code q stands for in a sub-block with factors dl and ml (SubBlock):
// dl·q − ml, or dl·(q − o) for the types without mins. The explicit float32 conversion keeps Go
// from fusing the multiply and the subtraction, which would round once where ggml rounds twice.
func (kt KQuantType) Value(dl, ml float32, q uint8) float32 {
	if !kt.Mins {
		return dl * float32(int(q)-kt.Offset)
	}
	return float32(dl*float32(q)) - ml
}

// dequantizeKRow writes row n of a k-quant tensor to out (len K), sub-block by sub-block.
func (t *Tensor) dequantizeKRow(out []float32, n int) {
	kt, _ := t.Scheme.KQuant()
	subs, blocks, perBlock := t.K/kt.Sub, t.Scheme.SuperBlocks(t.K), SuperBlock/kt.Sub
	codes := t.Codes[n*t.K : (n+1)*t.K]
	for j := range subs {
		b, lo := n*blocks+j/perBlock, j*kt.Sub
		var dmin float32
		var m uint8
		if kt.Mins {
			dmin, m = t.Mins[b], t.SubMins[n*subs+j]
		}
		dl, ml := kt.SubBlock(t.Scales[b], dmin, t.SubScales[n*subs+j], m)
		for i, q := range codes[lo : lo+kt.Sub] {
			out[lo+i] = kt.Value(dl, ml, q)
		}
	}
}
