package quant

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/qpack-dev/qpack/fp"
)

// The microscaled float grids: low-precision float codes in small blocks along K, each block
// with its own low-precision scale.
//
//	NVFP4     4-bit E2M1 codes (fp.F32ToE2M1) in blocks of 16; the block scale s is an FP8 E4M3
//	          value and the tensor has one float32 global scale G (Tensor.GlobalScale), a
//	          divisor as compressed-tensors stores it: w = e2m1(q)·(s/G), s/G rounded to float32
//	          first (compressed-tensors' _dequantize). 4.5 bits per weight plus 32 per tensor.
//	MXFP4     OCP Microscaling v1.0: E2M1 codes in blocks of 32, the block scale an E8M0 power of
//	          two 2^(e−127), e ∈ 0…254: w = e2m1(q)·2^(e−127). 4.25 bits per weight.
//	FP8Block  FP8 E4M3 codes with one float32 scale per B×B block of W (B = GroupSize: rows
//	          and columns), as DeepSeek-V3's and Qwen3's FP8 releases store them
//	          (weight_scale_inv): w = e4m3(q)·scale. The Tensor holds the scale of every row and
//	          column group (N × ⌈K/B⌉ Scales); the rows of one block carry the same scales.
//
// E2M1 codes carry the sign in bit 3 (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6); an FP4 row must
// hold whole blocks (CheckRowLength), an FP8 block may be partial at the edges of W.
const (
	// The values stay clear of the grids declared with iota in quant.go, so that other grids
	// can be added there. Schemes are stored by name, never by these numbers.
	NVFP4 Grid = 16 + iota
	MXFP4
	FP8Block
)

func init() {
	gridNames[NVFP4], gridNames[MXFP4], gridNames[FP8Block] = "nvfp4", "mxfp4", "fp8-block"
}

// The FP4 schemes, whose block sizes the formats fix.
var (
	NVFP4Scheme = Scheme{Grid: NVFP4, Bits: 4, GroupSize: 16, Sym: true}
	MXFP4Scheme = Scheme{Grid: MXFP4, Bits: 4, GroupSize: 32, Sym: true}
)

// FP8BlockScheme is FP8 with one scale per b×b block ("fp8-b128" for b = 128).
func FP8BlockScheme(b int) Scheme { return Scheme{Grid: FP8Block, Bits: 8, GroupSize: b, Sym: true} }

// FP4Values are the 16 E2M1 code values, sign in bit 3.
var FP4Values = func() (v [16]float32) {
	for i := range v {
		v[i] = fp.F4E2M1ToF32(uint8(i))
	}
	return v
}()

// FP4Max is the largest E2M1 magnitude.
const FP4Max = 6

// IsMicroscaled reports whether g is one of the grids of this file.
func (g Grid) IsMicroscaled() bool { return g == NVFP4 || g == MXFP4 || g == FP8Block }

// IsFP4 reports whether s codes E2M1 values (NVFP4 or MXFP4).
func (s Scheme) IsFP4() bool { return s.Grid == NVFP4 || s.Grid == MXFP4 }

func (s Scheme) validateMicroscaled() error {
	switch s.Grid {
	case NVFP4, MXFP4:
		want := NVFP4Scheme
		if s.Grid == MXFP4 {
			want = MXFP4Scheme
		}
		if s != want {
			return fmt.Errorf("scheme %s: %s is 4-bit and symmetric with blocks of %d", s, s.Grid, want.GroupSize)
		}
	case FP8Block:
		if s.Bits != 8 || !s.Sym || s.GroupSize <= 0 || s.GroupSize%8 != 0 {
			return fmt.Errorf("scheme %s: block FP8 is 8-bit and symmetric with square blocks of a positive multiple of 8", s)
		}
	}
	return nil
}

// microscaledName is String for the grids of this file.
func (s Scheme) microscaledName() string {
	if s.Grid == FP8Block {
		return "fp8-b" + strconv.Itoa(s.GroupSize)
	}
	return s.Grid.String()
}

// parseMicroscaled reads "nvfp4", "mxfp4" and "fp8-b<B>"; ok is false for any other name.
func parseMicroscaled(name string, parts []string) (s Scheme, ok bool, err error) {
	switch {
	case parts[0] == "nvfp4" || parts[0] == "mxfp4":
		s = NVFP4Scheme
		if parts[0] == "mxfp4" {
			s = MXFP4Scheme
		}
		if len(parts) > 1 {
			return Scheme{}, true, fmt.Errorf("scheme %q: %s has fixed blocks of %d and takes no group size or symmetry", name, s, s.GroupSize)
		}
		return s, true, nil
	case parts[0] == "fp8" && len(parts) == 2 && strings.HasPrefix(parts[1], "b"):
		b, err := strconv.Atoi(parts[1][1:])
		if err != nil {
			return Scheme{}, true, fmt.Errorf("scheme %q: bad block size %q", name, parts[1])
		}
		s = FP8BlockScheme(b)
		return s, true, s.Validate()
	}
	return Scheme{}, false, nil
}

// NVFP4GlobalScale is the global scale G of an NVFP4 tensor whose largest |w| is amax, as
// compressed-tensors computes it (generate_gparam): 448·6/amax, so that the block holding amax
// gets E4M3's largest scale. A zero amax gives 1; one so small that the quotient overflows
// gives the largest float32.
func NVFP4GlobalScale(amax float32) float32 {
	if amax == 0 {
		return 1
	}
	g := FP8MaxE4M3 * FP4Max / amax
	if math.IsInf(float64(g), 0) {
		return math.MaxFloat32
	}
	return g
}

// MinE4M3 is the smallest positive E4M3 value (2^−9): the block scale of an all-zero block.
var MinE4M3 = fp.E4M3ToF32(1)

// NVFP4BlockScale is the E4M3 block scale of an NVFP4 block whose largest |w| is amax under
// global scale g: E4M3(g·(amax/6)), saturating at 448; MinE4M3 when that rounds to zero.
func NVFP4BlockScale(amax, g float32) float32 {
	s := fp.E4M3ToF32(fp.F32ToE4M3(g * float32(amax/FP4Max)))
	if s == 0 {
		return MinE4M3
	}
	return s
}

// MXFP4Scale is the E8M0 block scale that OCP MX v1.0 (§6.3) gives a block whose largest |w| is
// amax: 2^(⌊log2 amax⌋ − 2), 2 being E2M1's largest exponent, clamped to 2^−127 … 2^127. The
// block's largest value then lies in [4, 8)·scale, and values above 6·scale saturate. An
// all-zero block gets 2^−127. llama.cpp's quantize_row_mxfp4_ref uses the same rule.
func MXFP4Scale(amax float32) float32 {
	if amax == 0 {
		return E8M0Value(0)
	}
	_, e := math.Frexp(float64(amax)) // amax = f·2^e, f ∈ [0.5, 1): ⌊log2 amax⌋ = e − 1
	return E8M0Value(uint8(min(max(e-1-2+127, 0), 254)))
}

// E8M0Value is 2^(e−127), the scale an E8M0 byte stands for (e ≠ 255, which is NaN).
func E8M0Value(e uint8) float32 { return fp.E8M0ToF32(e) }

// E8M0Byte is the E8M0 byte of a power of two in [2^−127, 2^127]; ok is false for any other
// value.
func E8M0Byte(scale float32) (e uint8, ok bool) {
	frac, exp := math.Frexp(float64(scale)) // scale = frac·2^exp
	if frac != 0.5 || exp-1 < -127 || exp-1 > 127 {
		return 0, false
	}
	return uint8(exp - 1 + 127), true
}

// E4M3Byte is the E4M3 byte of a positive, exactly representable E4M3 value; ok is false for
// any other value.
func E4M3Byte(scale float32) (b uint8, ok bool) {
	b = fp.F32ToE4M3(scale)
	return b, scale > 0 && fp.E4M3ToF32(b) == scale
}

// FP4Factor is the multiplier of a block's E2M1 values: s/G for NVFP4 (rounded to float32),
// s for MXFP4.
func (t *Tensor) FP4Factor(s float32) float32 {
	if t.Scheme.Grid == NVFP4 {
		return s / t.GlobalScale
	}
	return s
}

// validateMicroscaled is Validate for the grids of this file: slice lengths, codes, scales each
// grid can store, the global scale (NVFP4 only), and equal scales within an FP8 block.
func (t *Tensor) validateMicroscaled() error {
	s := t.Scheme
	groups := s.Groups(t.K)
	if err := s.CheckRowLength(t.K); err != nil {
		return err
	}
	if t.GIdx != nil {
		return fmt.Errorf("%s: microscaled blocks have no act-order group index (g_idx)", s)
	}
	for _, c := range []struct {
		what      string
		got, want int
	}{{"codes", len(t.Codes), t.N * t.K}, {"scales", len(t.Scales), t.N * groups}, {"zeros", len(t.Zeros), 0},
		{"offsets", len(t.Offsets), 0}, {"mins", len(t.Mins), 0}, {"sub-block scales", len(t.SubScales), 0},
		{"sub-block mins", len(t.SubMins), 0}} {
		if err := checkLen(c.what, c.got, c.want); err != nil {
			return err
		}
	}
	if err := t.validateCodes(); err != nil {
		return err
	}
	g := t.GlobalScale
	if (s.Grid == NVFP4) != (g != 0) || !(g >= 0) || math.IsInf(float64(g), 0) {
		return fmt.Errorf("%s: global scale %g (NVFP4 needs a finite positive one, the other grids none)", s, g)
	}
	for i, v := range t.Scales {
		if err := checkBlockScale(s.Grid, v); err != nil {
			return fmt.Errorf("scale %g at row %d, block %d: %w", v, i/groups, i%groups, err)
		}
	}
	if s.Grid == FP8Block {
		return t.checkSharedBlockScales()
	}
	return nil
}

// checkBlockScale says whether v is a block scale grid g can store.
func checkBlockScale(g Grid, v float32) error {
	switch g {
	case NVFP4:
		if _, ok := E4M3Byte(v); !ok {
			return fmt.Errorf("not a positive E4M3 value")
		}
	case MXFP4:
		if _, ok := E8M0Byte(v); !ok {
			return fmt.Errorf("not a power of two in [2^-127, 2^127] (E8M0)")
		}
	default:
		if !(v > 0) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("scales must be finite and positive")
		}
	}
	return nil
}

// checkSharedBlockScales checks that the rows of each FP8 block carry the block's scales.
func (t *Tensor) checkSharedBlockScales() error {
	b, groups := t.Scheme.GroupSize, t.Scheme.Groups(t.K)
	for n := range t.N {
		first := n / b * b
		for g := range groups {
			if v, want := t.Scales[n*groups+g], t.Scales[first*groups+g]; v != want {
				return fmt.Errorf("%s: row %d has scale %g in column block %d, the first row of its block %g", t.Scheme, n, v, g, want)
			}
		}
	}
	return nil
}
