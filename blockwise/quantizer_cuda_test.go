package blockwise

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// gpuPTX lets a GPU run try kernels compiled there (nvcc -ptx) before the embedded PTX is
// regenerated: go test -args -blockwise.ptx=/path/blockwise.ptx
var gpuPTX = flag.String("blockwise.ptx", "", "load this PTX instead of the embedded kernels/blockwise.ptx")

func TestGPUPTXIsFresh(t *testing.T) {
	if err := cuda.CheckPTX(blockwisePTX, blockwiseSource); err != nil {
		t.Fatalf("kernels/blockwise.ptx: %v", err)
	}
	if err := cuda.CheckCubin(blockwiseCubinSM90, blockwisePTX); err != nil {
		t.Fatalf("kernels/blockwise.sm_90.cubin: %v", err)
	}
}

// openGPUQuantizer opens GPU 0 and the kernels, skipping without a driver or GPU.
func openGPUQuantizer(tb testing.TB) (*cuda.Device, *GPUQuantizer) {
	tb.Helper()
	dev := gputest.Open(tb)
	var cubins [][]byte // with -blockwise.ptx, that PTX alone
	if *gpuPTX == "" {
		cubins = append(cubins, blockwiseCubinSM90)
	}
	q, err := newGPUQuantizer(dev, DefaultGPUSlots, gputest.PTX(tb, blockwisePTX, *gpuPTX), cubins...)
	if err != nil {
		tb.Fatal(err)
	}
	if *gpuFP4PTX != "" {
		q.fp4.images = [][]byte{gputest.PTX(tb, microscaledPTX, *gpuFP4PTX)}
	}
	tb.Cleanup(func() { q.Close() })
	return dev, q
}

// gpuTestWeights returns n×k weights: Gaussian rows of varying magnitude, plus rows that hit
// the edge cases of the parameter formulas (all zero, all positive, tiny, outliers, all
// negative, one non-zero value).
func gpuTestWeights(r *rand.Rand, n, k int) []float32 {
	w := make([]float32, n*k)
	for row := range n {
		mag := float32(math.Exp2(r.Float64()*14 - 10))
		for c := range k {
			v := float32(r.NormFloat64()) * mag
			switch row % 8 {
			case 1:
				v = 0
			case 2:
				v = float32(math.Abs(float64(v)))
			case 3:
				v *= 1e-8 // scales underflow F16 and become its smallest subnormal
			case 4:
				if r.IntN(50) == 0 {
					v *= 30
				}
			case 5:
				v = -float32(math.Abs(float64(v)))
			case 6:
				if c%37 != 5 {
					v = 0
				}
			}
			w[row*k+c] = v
		}
	}
	return w
}

// encodeWeights stores w as raw little-endian dtype bytes and returns the float32 values those
// bytes hold (what the CPU path quantizes).
func encodeWeights(w []float32, dtype string) ([]byte, []float32) {
	held := make([]float32, len(w))
	if dtype == "F32" {
		raw := make([]byte, 4*len(w))
		for i, v := range w {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
		}
		return raw, append(held[:0], w...)
	}
	raw := make([]byte, 2*len(w))
	for i, v := range w {
		var h uint16
		if dtype == "BF16" {
			h = fp.F32ToBF16(v)
			held[i] = fp.BF16ToF32(h)
		} else {
			h = fp.F32ToF16(v)
			held[i] = fp.F16ToF32(h)
		}
		binary.LittleEndian.PutUint16(raw[2*i:], h)
	}
	return raw, held
}

// cpuQuantizePack is the reference: Quantize, then the format's Pack.
func cpuQuantizePack(w []float32, n, k int, s quant.Scheme, format, prefix string) ([]packing.Raw, error) {
	f, err := packing.Lookup(format)
	if err != nil {
		return nil, err
	}
	t, err := Quantize(w, n, k, s, Options{})
	if err != nil {
		return nil, err
	}
	return f.Pack(prefix, t)
}

func compareRaws(t *testing.T, what string, got, want []packing.Raw) {
	t.Helper()
	for _, d := range diffRaws(what, got, want) {
		t.Error(d)
	}
}

// diffRaws describes how got differs from want (nothing when they are the same tensors).
func diffRaws(what string, got, want []packing.Raw) []string {
	if len(got) != len(want) {
		return []string{fmt.Sprintf("%s: %d tensors, want %d", what, len(got), len(want))}
	}
	var diffs []string
	for i := range want {
		g, w := got[i], want[i]
		switch {
		case g.Name != w.Name || g.DType != w.DType || !slices.Equal(g.Shape, w.Shape):
			diffs = append(diffs, fmt.Sprintf("%s: tensor %d is %s %s%v, want %s %s%v", what, i, g.Name, g.DType, g.Shape, w.Name, w.DType, w.Shape))
		case !bytes.Equal(g.Data, w.Data):
			diffs = append(diffs, fmt.Sprintf("%s: %s differs from the reference at byte %d of %d", what, w.Name, firstDiff(g.Data, w.Data), len(w.Data)))
		}
	}
	return diffs
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestGPUQuantizerMatchesCPU(t *testing.T) {
	_, q := openGPUQuantizer(t)
	q.poison = true
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 7))
	intSchemes := []string{"int4-g128-asym", "int4-g128-sym", "int8-g128-asym", "int8-g128-sym", "int2-g64-asym",
		"int3-g128-asym", "int3-g32-sym", "int4-g32-asym", "int4-g8-asym", "int4-g256-sym", "int4-pc-asym",
		"int4-g96-asym", "int8-g512-sym", "int2-pc-sym"}
	qpackOnly := []string{"nf4-g64", "nf4-g128", "nf4-g8", "nf4-pc", "nf4-g96", "bin-g128-asym", "bin-g128-sym",
		"bin-pc-asym", "bin-g40-asym"}
	// N not a multiple of 8 or 32; K with a partial last group; K = 4 mod 8 (8-bit GPTQ only);
	// K odd and tiny (qpack only: GPTQ refuses them, which the reference must do too).
	shapes := [][2]int{{13, 544}, {37, 4096}, {300, 1056}, {70, 200}, {9, 132}, {21, 203}, {5, 13}, {64, 256}}
	dtypes := []string{"BF16", "F16", "F32"}
	runs := 0
	for _, format := range []string{"gptq", "gptq_v2", "qpack"} {
		names := intSchemes
		if format == "qpack" {
			names = append(slices.Clone(intSchemes), qpackOnly...)
		}
		for _, name := range names {
			s, err := quant.ParseScheme(name)
			if err != nil {
				t.Fatal(err)
			}
			if !q.Supports(s, format) {
				t.Errorf("Supports(%s, %s) = false", name, format)
				continue
			}
			for _, shape := range shapes {
				n, k := shape[0], shape[1]
				dtype := dtypes[runs%len(dtypes)]
				runs++
				raw, held := encodeWeights(gpuTestWeights(r, n, k), dtype)
				what := fmt.Sprintf("%s %s %s %dx%d", format, name, dtype, n, k)
				want, werr := cpuQuantizePack(held, n, k, s, format, "m.w")
				got, gerr := q.QuantizePack(raw, dtype, n, k, s, format, "m.w")
				if werr != nil || gerr != nil {
					if (werr == nil) != (gerr == nil) {
						t.Errorf("%s: GPU error %v, CPU error %v", what, gerr, werr)
					}
					continue
				}
				compareRaws(t, what, got, want)
			}
		}
	}
	// Every dtype on the main scheme, on a larger tensor.
	s := quant.Scheme{Bits: 4, GroupSize: 128, Grid: quant.Integer}
	for _, dtype := range dtypes {
		raw, held := encodeWeights(gpuTestWeights(r, 1000, 2176), dtype)
		want, err := cpuQuantizePack(held, 1000, 2176, s, "gptq", "x")
		if err != nil {
			t.Fatal(err)
		}
		got, err := q.QuantizePack(raw, dtype, 1000, 2176, s, "gptq", "x")
		if err != nil {
			t.Fatal(err)
		}
		compareRaws(t, "gptq int4 1000x2176 "+dtype, got, want)
	}
}

func TestGPUQuantizerReportsBadInput(t *testing.T) {
	_, q := openGPUQuantizer(t)
	const n, k = 16, 256
	s := quant.Scheme{Bits: 4, GroupSize: 128, Grid: quant.Integer}
	raw, _ := encodeWeights(gpuTestWeights(rand.New(rand.NewPCG(1, 2)), n, k), "BF16")
	nan := slices.Clone(raw)
	nan[2*(5*k+77)], nan[2*(5*k+77)+1] = 0xc0, 0x7f // BF16 NaN at row 5, column 77
	for _, format := range []string{"gptq", "qpack"} {
		if _, err := q.QuantizePack(nan, "BF16", n, k, s, format, "w"); err == nil || !strings.Contains(err.Error(), "row 5, column 77") {
			t.Errorf("%s, NaN weight: got %v", format, err)
		}
	}
	huge := slices.Clone(raw)
	big := fp.F32ToBF16(3e38)
	huge[2*(9*k+130)], huge[2*(9*k+130)+1] = byte(big), byte(big>>8)
	if _, err := q.QuantizePack(huge, "BF16", n, k, s, "gptq", "w"); err == nil || !strings.Contains(err.Error(), "row 9, group 1") {
		t.Errorf("scale overflowing F16: got %v", err)
	}
	bin := quant.Scheme{Bits: 1, GroupSize: 128, Grid: quant.Binary}
	if _, err := q.QuantizePack(huge, "BF16", n, k, bin, "qpack", "w"); err == nil || !strings.Contains(err.Error(), "row 9, group 1") {
		t.Errorf("binary offset overflowing F16: got %v", err)
	}
	if _, err := q.QuantizePack(raw[:10], "BF16", n, k, s, "gptq", "w"); err == nil {
		t.Error("short input accepted")
	}
	if _, err := q.QuantizePack(raw, "I8", n, k, s, "gptq", "w"); err == nil {
		t.Error("dtype I8 accepted")
	}
	fillErr := errors.New("disk gone")
	err := q.QuantizePackWith(func([]byte) error { return fillErr }, "BF16", n, k, s, "gptq", "w",
		func([]packing.Raw) error { t.Error("use called after a failed fill"); return nil })
	if !errors.Is(err, fillErr) || !strings.Contains(err.Error(), "tensor w") {
		t.Errorf("failing fill: got %v", err)
	}
	useErr := errors.New("write failed")
	if err := q.QuantizePackWith(func(dst []byte) error { copy(dst, raw); return nil }, "BF16", n, k, s, "gptq", "w",
		func([]packing.Raw) error { return useErr }); !errors.Is(err, useErr) {
		t.Errorf("failing use: got %v", err)
	}
	// After errors the quantizer still works.
	if _, err := q.QuantizePack(raw, "BF16", n, k, s, "gptq", "w"); err != nil {
		t.Errorf("good input after bad ones: %v", err)
	}
}

func TestGPUQuantizerSupports(t *testing.T) {
	q := &GPUQuantizer{}
	for _, c := range []struct {
		scheme, format string
		want           bool
	}{
		{"int4-g128-asym", "gptq", true}, {"int3-pc-sym", "gptq_v2", true}, {"nf4-g64", "qpack", true},
		{"bin-g128-sym", "qpack", true}, {"nf4-g64", "gptq", false}, {"fp8", "qpack", false},
		{"int4-g128-asym", "awq", false}, {"int8-g128-sym", "compressed-tensors", false},
		{"q4_k", "qpack", false}, {"q6_k", "qpack", false}, {"q2_k", "gptq", false},
	} {
		s, err := quant.ParseScheme(c.scheme)
		if err != nil {
			t.Fatal(err)
		}
		if got := q.Supports(s, c.format); got != c.want {
			t.Errorf("Supports(%s, %s) = %v, want %v", c.scheme, c.format, got, c.want)
		}
	}
}

// TestGPUQuantizerGPTQ4G128 covers the hottest case, GPTQ int4 with groups of 128, on every
// dtype (BF16 and F16 on bw_piece_int4_g128, F32 on the fused tile kernel), both GPTQ formats
// and both zero-point modes, with N not a multiple of 8 or 16 (partial qzeros words and row
// bands), K of one piece and of several blocks (idle warps), and 16-bit weights, whose
// quotients hit exact rounding ties often.
func TestGPUQuantizerGPTQ4G128(t *testing.T) {
	_, q := openGPUQuantizer(t)
	q.poison = true
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 11))
	for _, shape := range [][2]int{{45, 640}, {16, 128}, {203, 1152}, {33, 2176}} {
		n, k := shape[0], shape[1]
		for _, name := range []string{"int4-g128-asym", "int4-g128-sym"} {
			s, err := quant.ParseScheme(name)
			if err != nil {
				t.Fatal(err)
			}
			for _, format := range []string{"gptq", "gptq_v2"} {
				for _, dtype := range []string{"BF16", "F16", "F32"} {
					kernel := func(j gpuJob) bool {
						if dtype == "F32" {
							return j.pieceKernel() == "" && j.fused()
						}
						return j.pieceKernel() == "bw_piece_int4_g128"+kernelSuffixes[j.dtype]
					}
					checkGPUAgainstCPU(t, q, r, dtype, n, k, s, format, kernel, true)
				}
			}
		}
	}
}

// gpuFormats are the formats the GPU quantizer packs scheme s in.
func gpuFormats(s quant.Scheme) []string {
	if s.Grid == quant.Integer {
		return []string{"gptq", "gptq_v2", "qpack"}
	}
	return []string{"qpack"}
}

// checkGPUAgainstCPU checks that takes(job) is want (whether a given kernel runs the job), then
// quantizes fresh weights on the GPU and compares the result with the CPU reference.
func checkGPUAgainstCPU(t *testing.T, q *GPUQuantizer, r *rand.Rand, dtype string, n, k int, s quant.Scheme, format string,
	takes func(gpuJob) bool, want bool) {
	t.Helper()
	what := fmt.Sprintf("%s %s %s %dx%d", format, s, dtype, n, k)
	j, err := newGPUJob(dtype, n, k, s, format, "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := takes(j); got != want {
		t.Fatalf("%s: takes the kernel under test: %v, want %v", what, got, want)
	}
	checkAgainstCPU(t, r, j, dtype, func(raw []byte) ([]packing.Raw, error) {
		return q.QuantizePack(raw, dtype, n, k, s, format, "m")
	})
}

// checkAgainstCPU quantizes fresh weights for job j (tensor prefix "m") with quantize and
// compares the result with the CPU reference.
func checkAgainstCPU(t *testing.T, r *rand.Rand, j gpuJob, dtype string, quantize func(raw []byte) ([]packing.Raw, error)) {
	t.Helper()
	what := fmt.Sprintf("%s %s %s %dx%d", j.format, j.s, dtype, j.n, j.k)
	raw, held := encodeWeights(gpuTestWeights(r, j.n, j.k), dtype)
	want, err := cpuQuantizePack(held, j.n, j.k, j.s, j.format, "m")
	if err != nil {
		t.Fatal(err)
	}
	got, err := quantize(raw)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	compareRaws(t, what, got, want)
}

// pieceSchemes are the schemes of bw_piece_* and bw_bin_*: integer 2/3/4/8-bit (both zero-point
// modes), NF4 and binary (both), groups of 32, 64, 128.
func pieceSchemes() []string {
	var names []string
	for _, gs := range pieceGroupSizes {
		for _, b := range []int{2, 3, 4, 8} {
			names = append(names, fmt.Sprintf("int%d-g%d-asym", b, gs), fmt.Sprintf("int%d-g%d-sym", b, gs))
		}
		names = append(names, fmt.Sprintf("nf4-g%d", gs), fmt.Sprintf("bin-g%d-asym", gs), fmt.Sprintf("bin-g%d-sym", gs))
	}
	return names
}

// TestGPUQuantizerPieces covers the one-launch kernels bw_piece_* (integer 2/3/4/8-bit and NF4
// groups of 32, 64, 128) and bw_bin_* (binary groups of 32, 64, 128) in every format they serve,
// on both 16-bit dtypes and both zero-point modes: N not a multiple of 16 (partial row bands and
// qzeros words; 3-bit GPTQ qzeros words shared by two bands), K of one piece, and K of 9 or 10
// pieces (blocks with idle warps, a half-filled qpack zero byte for 4-bit g128).
func TestGPUQuantizerPieces(t *testing.T) {
	_, q := openGPUQuantizer(t)
	q.poison = true
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 13))
	for _, shape := range [][2]int{{45, 1152}, {16, 128}, {203, 384}, {33, 1280}, {16, 256}} {
		n, k := shape[0], shape[1]
		for _, name := range pieceSchemes() {
			s, err := quant.ParseScheme(name)
			if err != nil {
				t.Fatal(err)
			}
			for _, format := range gpuFormats(s) {
				for _, dtype := range []string{"BF16", "F16"} {
					takes := func(j gpuJob) bool { return j.pieceKernel() != "" || j.binKernel() != "" }
					// bw_bin_* needs K a multiple of two groups
					want := s.Grid != quant.Binary || k%(2*s.GroupSize) == 0
					checkGPUAgainstCPU(t, q, r, dtype, n, k, s, format, takes, want)
				}
			}
		}
	}
}

// rowpcTestShapes are TestGPUQuantizerRowPC's shapes; rowpcTestSchemes its schemes.
var (
	rowpcTestShapes  = [][2]int{{13, 1000}, {45, 4096}, {8, 4104}, {11, 6144}, {5, 6152}, {21, 8192}, {3, 136}}
	rowpcTestSchemes = []string{"int4-pc-asym", "int4-pc-sym", "int8-pc-asym", "int8-pc-sym", "nf4-pc"}
)

// TestGPUQuantizerRowPC covers the per-channel kernels bw_rowpc_* in every format they serve, on
// both 16-bit dtypes and both zero-point modes: N not a multiple of 8 (a partial block of rows
// and partial qzeros words), K not a multiple of the 256 columns a warp loads at once, K at
// both register capacities (4096: CPL 16; 4104, 6144: CPL 24). GPTQ 8-bit with K = 6144 fills
// the 48 KiB shared-memory stage exactly. K = 6152 and 8192 are too long and keep the two-kernel
// path (checked too).
func TestGPUQuantizerRowPC(t *testing.T) {
	_, q := openGPUQuantizer(t)
	q.poison = true
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 17))
	takes := func(j gpuJob) bool { return j.rowpcKernel() != "" }
	eachJob(t, r, rowpcTestShapes, rowpcTestSchemes, func(j gpuJob, dtype string) {
		checkGPUAgainstCPU(t, q, r, dtype, j.n, j.k, j.s, j.format, takes, j.k <= rowpcMaxCols)
	})
}

// eachJob calls check with the job of every shape, scheme (by name) and format the GPU packs it
// in, on BF16 or F16 weights as r picks.
func eachJob(t *testing.T, r *rand.Rand, shapes [][2]int, schemes []string, check func(j gpuJob, dtype string)) {
	t.Helper()
	for _, shape := range shapes {
		for _, name := range schemes {
			s, err := quant.ParseScheme(name)
			if err != nil {
				t.Fatal(err)
			}
			for _, format := range gpuFormats(s) {
				dtype := []string{"BF16", "F16"}[r.IntN(2)]
				j, err := newGPUJob(dtype, shape[0], shape[1], s, format, "m", 0)
				if err != nil {
					t.Fatal(err)
				}
				check(j, dtype)
			}
		}
	}
}

// badInputCase is a tensor with bad weights and the error it must give.
type badInputCase struct {
	scheme, format string
	bad            [][3]float32 // row, column, value
	want           string
}

// badInputN × badInputK is the tensor of badInputCases.
const badInputN, badInputK = 40, 512

// badInputCases are the bad inputs of the one-launch kernels bw_piece_*, bw_rowpc_* and bw_bin_*:
// the lowest non-finite weight (NaN or Inf, in either lane of a row and in any group of a piece,
// two bad weights so that the lower one must win) and a scale or offset that overflows F16.
func badInputCases() []badInputCase {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	return []badInputCase{
		{"int4-g128-asym", "qpack", [][3]float32{{21, 300, nan}, {30, 2, nan}}, "row 21, column 300"},
		{"int8-g32-sym", "gptq", [][3]float32{{33, 9, -inf}}, "row 33, column 9"},
		{"int4-g128-asym", "gptq", [][3]float32{{21, 300, inf}, {21, 257, nan}}, "row 21, column 257"},
		{"int4-g128-sym", "gptq_v2", [][3]float32{{9, 130, 3e38}}, "row 9, group 1"},
		{"int8-g64-asym", "qpack", [][3]float32{{2, 511, inf}, {2, 509, nan}}, "row 2, column 509"},
		{"nf4-g64", "qpack", [][3]float32{{17, 200, inf}}, "row 17, column 200"},
		{"nf4-g32", "qpack", [][3]float32{{38, 511, nan}}, "row 38, column 511"},
		{"int4-g64-asym", "qpack", [][3]float32{{5, 70, 3e38}}, "row 5, group 1"},
		{"nf4-g128", "qpack", [][3]float32{{9, 130, -3e38}}, "row 9, group 1"},
		{"int4-pc-asym", "gptq", [][3]float32{{12, 400, nan}, {12, 401, inf}}, "row 12, column 400"},
		{"nf4-pc", "qpack", [][3]float32{{39, 3, -inf}}, "row 39, column 3"},
		{"int8-pc-sym", "qpack", [][3]float32{{5, 70, 3e38}}, "row 5, group 0"},
		{"int3-g128-asym", "gptq", [][3]float32{{21, 300, nan}, {30, 2, nan}}, "row 21, column 300"},
		{"int2-g64-asym", "qpack", [][3]float32{{2, 511, inf}, {2, 509, nan}}, "row 2, column 509"},
		{"int3-g32-sym", "qpack", [][3]float32{{5, 70, 3e38}}, "row 5, group 2"},
		{"bin-g128-asym", "qpack", [][3]float32{{33, 9, -inf}, {33, 300, nan}}, "row 33, column 9"},
		{"bin-g64-sym", "qpack", [][3]float32{{38, 511, nan}}, "row 38, column 511"},
		{"bin-g128-asym", "qpack", [][3]float32{{9, 130, 3e38}}, "row 9, group 1"},
		{"bin-g32-sym", "qpack", [][3]float32{{9, 130, -3e38}, {9, 131, -3e38}}, "row 9, group 4"},
	}
}

// checkBadInputs runs every bad input of badInputCases that takes(job) through quantize
// (BF16 weights) and checks the error.
func checkBadInputs(t *testing.T, takes func(gpuJob) bool, quantize func(j gpuJob, raw []byte) error) {
	t.Helper()
	const n, k = badInputN, badInputK
	good, _ := encodeWeights(gpuTestWeights(rand.New(rand.NewPCG(3, 4)), n, k), "BF16")
	for _, c := range badInputCases() {
		s, err := quant.ParseScheme(c.scheme)
		if err != nil {
			t.Fatal(err)
		}
		j, err := newGPUJob("BF16", n, k, s, c.format, "w", 0)
		if err != nil {
			t.Fatal(err)
		}
		if !takes(j) {
			continue
		}
		raw := slices.Clone(good)
		for _, b := range c.bad {
			at, h := 2*(int(b[0])*k+int(b[1])), fp.F32ToBF16(b[2])
			raw[at], raw[at+1] = byte(h), byte(h>>8)
		}
		if err := quantize(j, raw); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: got %v, want an error naming %q", c.format, c.scheme, err, c.want)
		}
	}
}

// TestGPUQuantizerPiecesReportBadInput checks the status reports of bw_piece_*, bw_rowpc_* and
// bw_bin_* (badInputCases).
func TestGPUQuantizerPiecesReportBadInput(t *testing.T) {
	_, q := openGPUQuantizer(t)
	for _, c := range badInputCases() {
		s, err := quant.ParseScheme(c.scheme)
		if err != nil {
			t.Fatal(err)
		}
		if j, err := newGPUJob("BF16", badInputN, badInputK, s, c.format, "w", 0); err != nil || j.pieceKernel()+j.rowpcKernel()+j.binKernel() == "" {
			t.Fatalf("%s %s: no bw_piece, bw_rowpc or bw_bin kernel (%v)", c.format, c.scheme, err)
		}
	}
	checkBadInputs(t, func(gpuJob) bool { return true }, func(j gpuJob, raw []byte) error {
		_, err := q.QuantizePack(raw, "BF16", j.n, j.k, j.s, j.format, "w")
		return err
	})
}

// TestGPURoundExactExhaustive checks int_round_exact, the division-free rounding the kernels use
// for BF16 and F16 weights, against rintf of the true division, and the NF4 code of
// quotient_exact against that of the true division, on every finite 16-bit weight and every
// finite positive F16 scale (2^16 × 31,743 pairs per dtype) where the kernels use them; for NF4
// also the bucket table of the bw_piece_nf4 kernels (nf4_code_table, both variants).
func TestGPURoundExactExhaustive(t *testing.T) {
	dev, q := openGPUQuantizer(t)
	check, err := q.module.Function("bw_check_round_exact")
	if err != nil {
		t.Fatal(err)
	}
	buf, err := dev.Alloc(24)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(buf)
	for _, c := range []struct {
		dtype int32
		name  string
		nf4   cuda.DevicePtr // the NF4 thresholds, or 0: integer rounding
	}{{0, "BF16", 0}, {1, "F16", 0}, {0, "BF16 NF4", q.nf4}, {1, "F16 NF4", q.nf4}} {
		name := c.name
		init := make([]byte, 24)
		binary.LittleEndian.PutUint32(init[16:], math.MaxUint32)
		if err := dev.CopyToDevice(buf, init); err != nil {
			t.Fatal(err)
		}
		if err := check.Launch(cuda.Dim3{X: 256, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, 0, c.dtype, c.nf4, buf, buf.Add(16)); err != nil {
			t.Fatal(err)
		}
		out := make([]byte, 24)
		if err := dev.CopyFromDevice(out, buf); err != nil {
			t.Fatal(err)
		}
		bad, checked := binary.LittleEndian.Uint64(out), binary.LittleEndian.Uint64(out[8:])
		first := binary.LittleEndian.Uint32(out[16:])
		t.Logf("%s: %d weight/scale pairs compared", name, checked)
		if checked < 1_000_000_000 {
			t.Errorf("%s: only %d pairs compared", name, checked)
		}
		if bad > 0 {
			t.Errorf("%s: %d pairs code differently from the division, first weight bits %#04x, scale bits %#04x",
				name, bad, first>>16, first&0xffff)
		}
	}
}

// TestGPUQuantizerConcurrentCalls runs more concurrent callers than slots, on tensors of
// different shapes and schemes (so the slots' buffers grow at different times), and checks
// every result against the CPU and the statistics against what was moved.
func TestGPUQuantizerConcurrentCalls(t *testing.T) {
	_, q := openGPUQuantizer(t)
	q.poison = true
	r := rand.New(rand.NewPCG(11, 12))
	type job struct {
		raw    []byte
		n, k   int
		s      quant.Scheme
		format string
		want   []packing.Raw
	}
	var jobs []job
	var inBytes, outBytes int64
	for i := range 4 * q.Slots() {
		n, k := 64+37*i, 256*(1+i%5)
		s := quant.Scheme{Bits: []int{4, 8, 3, 2}[i%4], GroupSize: 128, Sym: i%2 == 0, Grid: quant.Integer}
		format := []string{"gptq", "qpack"}[i%2]
		raw, held := encodeWeights(gpuTestWeights(r, n, k), "BF16")
		want, err := cpuQuantizePack(held, n, k, s, format, "m")
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, job{raw, n, k, s, format, want})
		inBytes += int64(len(raw))
		for _, w := range want {
			outBytes += int64(len(w.Data))
		}
	}
	got := make([][]packing.Raw, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() { got[i], errs[i] = q.QuantizePack(j.raw, "BF16", j.n, j.k, j.s, j.format, "m") })
	}
	wg.Wait()
	for i, j := range jobs {
		if errs[i] != nil {
			t.Fatalf("job %d: %v", i, errs[i])
		}
		compareRaws(t, fmt.Sprintf("job %d %s %s %dx%d", i, j.format, j.s, j.n, j.k), got[i], j.want)
	}
	st := q.Stats()
	if st.Calls != len(jobs) || st.InBytes != inBytes || st.OutBytes != outBytes {
		t.Errorf("stats: %d calls, %d bytes in, %d out; want %d, %d, %d", st.Calls, st.InBytes, st.OutBytes, len(jobs), inBytes, outBytes)
	}
	if st.Staging <= 0 || st.Upload <= 0 || st.Kernels <= 0 || st.Download <= 0 || st.Use <= 0 {
		t.Errorf("stats: a phase was not timed: %+v", st)
	}
}

// TestGPUStatsRecord checks the accumulation, from concurrent callers, without a GPU.
func TestGPUStatsRecord(t *testing.T) {
	q := &GPUQuantizer{}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			q.stats.Record(cuda.CallTimes{Wait: 1, Staging: 2, Upload: 3, Kernels: 4, Download: 5, Use: time.Duration(i)}, 100, 10)
		})
	}
	wg.Wait()
	want := GPUStats{Calls: 50, InBytes: 5000, OutBytes: 500, Wait: 50, Staging: 100, Upload: 150, Kernels: 200,
		Download: 250, Use: 49 * 50 / 2}
	if got := q.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

func TestGPUQuantizerNeedsASlot(t *testing.T) {
	if _, err := newGPUQuantizer(nil, 0, nil); err == nil || !strings.Contains(err.Error(), "at least one slot") {
		t.Errorf("newGPUQuantizer with 0 slots: %v", err)
	}
}
