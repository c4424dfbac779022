// Package quant is qpack's numeric core: quantization schemes, the quantized tensor they
// produce, per-group parameters, and quantize/dequantize of single values.
package quant

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/qpack-dev/qpack/fp"
)

// Grid is the set of values a code can stand for.
type Grid int

const (
	// Integer codes 0..2^bits-1 on a uniform grid: w = scale·(q − zero).
	Integer Grid = iota
	// NF4: 16 codes at the quantiles of a normal distribution, w = scale·nf4[q] (bits = 4).
	NF4
	// FP8E4M3: codes are FP8 E4M3FN bytes, w = scale·e4m3(q), one scale per output channel (bits = 8).
	FP8E4M3
	// Binary (INT1): codes 0/1 mean −1/+1: w = offset + scale·(2q − 1) (offset 0 when symmetric).
	Binary
	// KQuant: llama.cpp's super-block formats q2_k … q6_k (kquant.go): per super-block of 256
	// weights an F16 scale d (and dmin), per sub-block an integer scale (and min).
	KQuant
	// IQuant: llama.cpp's IQ formats iq1_s … iq4_xs (iquant.go), named by Scheme.IQ: lattice
	// points with signs (or 4-bit non-uniform codes), per-sub-block integer scales, F16 block scales.
	IQuant
)

var gridNames = map[Grid]string{Integer: "int", NF4: "nf4", FP8E4M3: "fp8", Binary: "bin", KQuant: "kquant", IQuant: "iquant"}

func (g Grid) String() string {
	if s, ok := gridNames[g]; ok {
		return s
	}
	return fmt.Sprintf("Grid(%d)", int(g))
}

// PerChannel as a group size means one group per output row (the whole K axis).
const PerChannel = 0

// Scheme says how one weight tensor is quantized. The zero value is not valid; use a
// constructor-literal such as Scheme{Bits: 4, GroupSize: 128}.
type Scheme struct {
	Bits      int  // code width: 1 (binary), 2 … 8 (integer), 4 (NF4, FP4), 8 (FP8) or 2 … 6 (k-quant)
	GroupSize int  // input channels (K) per scale; PerChannel for one group per row; k-quant: the sub-block; FP8Block: the block's edge
	Sym       bool // symmetric: fixed zero point 2^(bits−1) (integer), no offset (binary), no mins (k-quant)
	Grid      Grid
	IQ        IQType // the IQ format (grid IQuant only)
}

// Validate reports whether the scheme is one qpack can quantize and pack.
func (s Scheme) Validate() error {
	switch s.Grid {
	case Integer:
		if s.Bits < 2 || s.Bits > 8 {
			return fmt.Errorf("scheme %s: integer grid needs 2 to 8 bits", s)
		}
	case NF4:
		if s.Bits != 4 {
			return fmt.Errorf("scheme %s: nf4 is 4-bit", s)
		}
	case FP8E4M3:
		if s.Bits != 8 || s.GroupSize != PerChannel {
			return fmt.Errorf("scheme %s: fp8 is 8-bit with one scale per output channel", s)
		}
	case Binary:
		if s.Bits != 1 {
			return fmt.Errorf("scheme %s: binary is 1-bit", s)
		}
	case KQuant:
		return s.validateKQuant()
	case IQuant:
		return s.validateIQuant()
	case NVFP4, MXFP4, FP8Block:
		return s.validateMicroscaled()
	default:
		return fmt.Errorf("unknown grid %d", int(s.Grid))
	}
	if s.IQ != IQNone {
		return fmt.Errorf("scheme %s: an IQ type belongs to the iquant grid only", s)
	}
	if s.GroupSize < 0 || (s.GroupSize != PerChannel && s.GroupSize%8 != 0) {
		return fmt.Errorf("scheme %s: group size must be per-channel or a positive multiple of 8", s)
	}
	return nil
}

// String gives the canonical name, e.g. "int4-g128-asym", "int8-pc-sym", "nf4-g64", "fp8", "bin-g128-asym",
// "q4_k", "iq2_xs", "nvfp4", "mxfp4", "fp8-b128". ParseScheme reads it back.
func (s Scheme) String() string {
	if s.Grid == KQuant {
		return fmt.Sprintf("q%d_k", s.Bits)
	}
	if s.Grid == IQuant {
		return s.IQ.String()
	}
	if s.Grid.IsMicroscaled() {
		return s.microscaledName()
	}
	var b strings.Builder
	b.WriteString(s.Grid.String())
	if s.Grid == Integer {
		b.WriteString(strconv.Itoa(s.Bits))
	}
	if s.Grid == FP8E4M3 {
		return b.String()
	}
	if s.GroupSize == PerChannel {
		b.WriteString("-pc")
	} else {
		fmt.Fprintf(&b, "-g%d", s.GroupSize)
	}
	if s.Grid == Integer || s.Grid == Binary {
		if s.Sym {
			b.WriteString("-sym")
		} else {
			b.WriteString("-asym")
		}
	}
	return b.String()
}

// ggmlAliases name the integer schemes whose groups are llama.cpp's Q8_0, Q5_0 and Q4_0
// blocks (32 weights, an F16 scale, a fixed zero point).
var ggmlAliases = map[string]string{"q8_0": "int8-g32-sym", "q5_0": "int5-g32-sym", "q4_0": "int4-g32-sym"}

// ParseScheme reads a scheme name as written by Scheme.String. The group part defaults to 128
// and symmetry to asymmetric when left out ("int4" = "int4-g128-asym"); a k-quant ("q4_k") or
// IQ type ("iq3_s") has neither. llama.cpp's q8_0, q5_0 and q4_0 name int8-g32-sym, int5-g32-sym and
// int4-g32-sym.
func ParseScheme(name string) (Scheme, error) {
	if alias, ok := ggmlAliases[strings.ToLower(strings.TrimSpace(name))]; ok {
		name = alias
	}
	parts := strings.Split(strings.ToLower(strings.TrimSpace(name)), "-")
	if s, ok, err := parseMicroscaled(name, parts); ok {
		return s, err
	}
	s := Scheme{GroupSize: 128}
	head := parts[0]
	switch {
	case strings.HasPrefix(head, "q") && strings.HasSuffix(head, "_k"):
		return parseKQuant(name, parts)
	case strings.HasPrefix(head, "iq"):
		return parseIQuant(name, parts)
	case head == "nf4":
		s.Grid, s.Bits, s.Sym = NF4, 4, true
	case head == "fp8":
		s.Grid, s.Bits, s.GroupSize, s.Sym = FP8E4M3, 8, PerChannel, true
	case head == "bin" || head == "int1":
		s.Grid, s.Bits = Binary, 1
	case strings.HasPrefix(head, "int"):
		bits, err := strconv.Atoi(head[3:])
		if err != nil {
			return Scheme{}, fmt.Errorf("scheme %q: bad bit width %q", name, head[3:])
		}
		s.Grid, s.Bits = Integer, bits
	default:
		return Scheme{}, fmt.Errorf("scheme %q: unknown grid %q (want int2 … int8, nf4, fp8, fp8-b128, bin, q2_k … q6_k, iq1_s … iq4_xs, nvfp4 or mxfp4)", name, head)
	}
	for _, p := range parts[1:] {
		switch {
		case p == "sym":
			s.Sym = true
		case p == "asym":
			s.Sym = false
		case p == "pc":
			s.GroupSize = PerChannel
		case strings.HasPrefix(p, "g"):
			g, err := strconv.Atoi(p[1:])
			if err != nil {
				return Scheme{}, fmt.Errorf("scheme %q: bad group size %q", name, p)
			}
			s.GroupSize = g
		default:
			return Scheme{}, fmt.Errorf("scheme %q: unknown part %q", name, p)
		}
	}
	return s, s.Validate()
}

// Groups returns the number of groups along K (input channels).
func (s Scheme) Groups(k int) int {
	if s.GroupSize == PerChannel || s.GroupSize >= k {
		return 1
	}
	return (k + s.GroupSize - 1) / s.GroupSize
}

// MaxQ is the largest code, 2^bits − 1.
func (s Scheme) MaxQ() int { return 1<<s.Bits - 1 }

// Tensor is a quantized linear weight W[N, K] (out × in, PyTorch's orientation): one code per
// weight and per-group parameters. It is what every method produces and every packer consumes.
type Tensor struct {
	Scheme Scheme
	N, K   int
	// Codes holds N×K codes, row-major, each in [0, 2^bits). For FP8 they are E4M3 bytes.
	Codes []uint8
	// Scales holds N×groups scales, row-major; integer, NF4 and binary scales are exactly
	// representable in F16 (they were rounded before quantizing). FP8 has N×1 float32 scales.
	// K-quants hold N×super-blocks super-block scales d here (F16 values, any sign, 0 allowed).
	Scales []float32
	// Zeros holds N×groups integer zero points (integer grid only; 2^(bits−1) when symmetric).
	Zeros []uint8
	// Offsets holds N×groups centres for the asymmetric binary grid, F16-representable.
	Offsets []float32
	// GIdx, when not nil, gives the group of each input column (GPTQ act-order); otherwise
	// column k belongs to group k / GroupSize.
	GIdx []int32

	// The k-quant parameters (grid KQuant only; see kquant.go). A row's K weights form
	// SuperBlocks(K) super-blocks of up to 256 weights, each of whole sub-blocks of GroupSize;
	// sub-block j of row n has the integer scale SubScales[n·K/G + j] (and min SubMins[…]), its
	// super-block the F16 scale d in Scales (and dmin in Mins). Codes are unsigned: q3_k's code q
	// stands for q − 4, q6_k's for q − 32.
	//
	// Mins holds N×super-blocks dmin values (F16 values; q2_k, q4_k and q5_k only).
	Mins []float32
	// SubScales holds N×K/G sub-block scales: q2_k 0…15, q3_k −32…31, q4_k/q5_k 0…63, q6_k −128…127.
	SubScales []int8
	// SubMins holds N×K/G sub-block mins: q2_k 0…15, q4_k/q5_k 0…63 (min types only).
	SubMins []uint8

	// The IQ parameters (grid IQuant; see iquant.go), row-major like the codes. Scales holds
	// N×K/Block block scales d (F16 values) and SubScales N×K/Sub sub-block scales (none for
	// iq4_nl). iq4_nl and iq4_xs have a 4-bit code per weight in Codes (an index into
	// IQ4Values); the lattice types have no Codes but:
	//
	// Points holds N×K/Dim grid indices, one per Dim weights.
	Points []uint16
	// Signs holds, for IQ2 and IQ3, N×K/8 sign bytes: bit j set when weight 8i+j is negative
	// (with an even number of bits set for iq2_xxs, iq2_xs and iq3_xxs); for IQ1, one byte per
	// SignGroup weights, 1 when their δ is −1/8.
	Signs []uint8

	// GlobalScale is an NVFP4 tensor's global scale G, a divisor of its E4M3 block scales
	// (microscaled.go); 0 for every other grid.
	GlobalScale float32
}

// Group returns the group index of input column k.
func (t *Tensor) Group(k int) int {
	if t.GIdx != nil {
		return int(t.GIdx[k])
	}
	if t.Scheme.GroupSize == PerChannel {
		return 0
	}
	return k / t.Scheme.GroupSize
}

// IntParams computes the scale and zero point of one integer-grid group from its weights, as
// the GPTQ reference quantizer does: the range always includes 0; asymmetric uses min-max,
// symmetric uses ±absmax with zero 2^(bits−1). The scale is rounded to F16 before the zero is
// derived from it, so that quantizing with the stored scale reproduces what dequantization sees.
func (s Scheme) IntParams(w []float32) (scale float32, zero uint8) {
	xmin, xmax := float32(0), float32(0)
	for _, v := range w {
		xmin = min(xmin, v)
		xmax = max(xmax, v)
	}
	return s.IntParamsRange(xmin, xmax)
}

// IntParamsRange is IntParams given the group's minimum and maximum (clipped ranges come in here).
func (s Scheme) IntParamsRange(xmin, xmax float32) (scale float32, zero uint8) {
	xmin, xmax = min(xmin, 0), max(xmax, 0)
	maxq := float32(s.MaxQ())
	if s.Sym {
		xmax = max(-xmin, xmax)
		if xmin < 0 {
			xmin = -xmax
		}
	}
	if xmin == 0 && xmax == 0 {
		xmin, xmax = -1, 1
	}
	scale = RoundF16((xmax - xmin) / maxq)
	if scale == 0 { // a range below F16's smallest subnormal: keep the smallest positive scale
		scale = fp.F16ToF32(1)
	}
	if s.Sym {
		return scale, uint8((s.MaxQ() + 1) / 2)
	}
	z := math.RoundToEven(float64(-xmin / scale))
	return scale, uint8(min(max(z, 0), float64(s.MaxQ())))
}

// QuantizeInt returns the integer code of w: clamp(round(w/scale) + zero, 0, maxq), ties to even.
func (s Scheme) QuantizeInt(w, scale float32, zero uint8) uint8 {
	q := math.RoundToEven(float64(w/scale)) + float64(zero)
	return uint8(min(max(q, 0), float64(s.MaxQ())))
}

// DequantizeInt returns scale·(q − zero).
func DequantizeInt(q uint8, scale float32, zero uint8) float32 {
	return scale * float32(int(q)-int(zero))
}

// RoundF16 rounds f to the nearest F16-representable value (ties to even).
func RoundF16(f float32) float32 { return fp.F16ToF32(fp.F32ToF16(f)) }
