package blockwise

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// hostKernels compiles kernels/blockwise.cu for the CPU (kernels/host: warps emulated with threads
// and barriers, each float operation rounded once) and returns the binary, or skips without
// -blockwise.hostcxx.
func hostKernels(t *testing.T) string {
	return hostKernelsFrom(t, "kernels")
}

// hostKernelsFrom is hostKernels with blockwise.cu taken from directory src.
func hostKernelsFrom(t *testing.T, src string) string {
	t.Helper()
	if *hostCXX == "" {
		t.Skip("-blockwise.hostcxx not set (a C++ compiler to run kernels/blockwise.cu on the CPU)")
	}
	bin := filepath.Join(t.TempDir(), "bw-host")
	cmd := exec.Command(*hostCXX, "-O2", "-ffp-contract=off", "-std=c++20", "-pthread", "-I", "kernels/host", "-I", src,
		"-o", bin, "kernels/host/blockwise_host.cpp")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd, err, out)
	}
	return bin
}

// nf4ThresholdBytes are quant.NF4Thresholds as the kernels read them.
func nf4ThresholdBytes() []byte {
	th := quant.NF4Thresholds()
	b := make([]byte, 4*len(th))
	for i, v := range th {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// hostQuantizePack runs job j's bw_piece_*, bw_rowpc_* or bw_bin_* kernel on the CPU, as enqueue
// launches it, and returns what QuantizePack would.
func hostQuantizePack(bin string, j gpuJob, raw []byte) ([]packing.Raw, error) {
	name := j.pieceKernel() + j.binKernel()
	g := j.pieceGrid()
	if rowpc := j.rowpcKernel(); rowpc != "" {
		name, g = rowpc, j.rowpcGrid()
	}
	if name == "" {
		return nil, fmt.Errorf("%s %s: no bw_piece, bw_rowpc or bw_bin kernel", j.format, j.s)
	}
	sym := 0
	if j.s.Sym {
		sym = 1
	}
	c, s, z, o := j.outputSizes()
	cmd := exec.Command(bin, name, fmt.Sprint(g.X), fmt.Sprint(g.Y), fmt.Sprint(j.n), fmt.Sprint(j.k), fmt.Sprint(sym),
		fmt.Sprint(j.zeroShift), fmt.Sprint(j.layout), fmt.Sprint(c), fmt.Sprint(s), fmt.Sprint(z), fmt.Sprint(o))
	cmd.Stdin = bytes.NewReader(append(nf4ThresholdBytes(), raw...))
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if len(out) != c+s+z+o+16 {
		return nil, fmt.Errorf("%s: %d bytes out, want %d", name, len(out), c+s+z+o+16)
	}
	st := out[c+s+z+o:]
	if err := j.statusError([2]uint64{binary.LittleEndian.Uint64(st), binary.LittleEndian.Uint64(st[8:])}); err != nil {
		return nil, err
	}
	return j.raws(out[:c], out[c:c+s], out[c+s:c+s+z], out[c+s+z:c+s+z+o]), nil
}

// TestKernelsOnCPU runs the one-launch kernels bw_piece_* (integer 2/3/4/8-bit and NF4 groups of
// 32, 64, 128; GPTQ int4 g128 among them), bw_rowpc_* (per-channel integer 4/8-bit and NF4) and
// bw_bin_* (binary groups of 32, 64, 128) on the CPU — the kernel source itself, its warps'
// shuffles and barriers included — in every format they serve, both 16-bit dtypes and zero-point
// modes, on gpuTestWeights (exact rounding ties, zero and one-value rows, tiny and large
// magnitudes), with N not a multiple of 8, 16 or 32 and K of one and of several blocks; every byte
// must be the CPU reference's. It also checks the reports of non-finite weights and of parameters
// out of F16's range, and NF4's bucket table on a sample of all (weight, scale) pairs (the GPU
// test TestGPURoundExactExhaustive takes all of them). What it cannot check is nvcc's
// compilation: TestGPUQuantizerPieces and TestGPUQuantizerRowPC do, on a GPU.
// go test ./blockwise -run KernelsOnCPU -args -blockwise.hostcxx=g++
func TestKernelsOnCPU(t *testing.T) {
	bin := hostKernels(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 19))
	// 45 rows: three bands, the last partial (GPTQ 3-bit qzeros: an even band without a next one
	// writes its second word whole); 1280 columns: 10 pieces (5 binary g128 pairs), two blocks, the
	// second with idle warps; 33 rows: one row in the third band.
	onCPU := func(j gpuJob, dtype string) {
		checkAgainstCPU(t, r, j, dtype, func(raw []byte) ([]packing.Raw, error) { return hostQuantizePack(bin, j, raw) })
	}
	eachJob(t, r, [][2]int{{45, 1280}, {33, 512}}, pieceSchemes(), onCPU)
	// bw_rowpc_*, on TestGPUQuantizerRowPC's shapes that it takes.
	eachJob(t, r, rowpcTestShapes, rowpcTestSchemes, func(j gpuJob, dtype string) {
		if j.rowpcKernel() != "" {
			onCPU(j, dtype)
		}
	})
}

// TestKernelsOnCPUCatchesBrokenKernels checks that TestKernelsOnCPU's comparison can fail where
// it matters most: each mutant of kernels/blockwise.cu (one edit of the GPTQ int4-g128 path of
// bw_piece_* or of bw_rowpc_*'s stage and clamp) must give bytes that differ from the reference
// in the formats it breaks.
func TestKernelsOnCPUCatchesBrokenKernels(t *testing.T) {
	src, err := os.ReadFile("kernels/blockwise.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name, old, new string
		scheme         string
		n, k           int
		formats        []string
	}{
		{"qweight words of the row's two lanes swapped",
			"((u64)pc * 16 + 2 * j + h) * wpc * n_rows", "((u64)pc * 16 + 2 * j + (h ^ 1)) * wpc * n_rows",
			"int4-g128-asym", 45, 1280, []string{"gptq", "gptq_v2"}},
		{"qzeros without the zero shift", // gptq stores z − 1; gptq_v2's shift is 0, where the mutant is the kernel
			"((unsigned int)((int)zero[q] - zero_shift) & maxq) << (BITS * ((lane >> 1) & (rpw - 1)))",
			"((unsigned int)((int)zero[q]) & maxq) << (BITS * ((lane >> 1) & (rpw - 1)))",
			"int4-g128-sym", 45, 1280, []string{"gptq"}},
		{"per-channel stage read without its swizzle",
			"((threadIdx.x / RPC_ROWS) ^ (rr << 2))", "((threadIdx.x / RPC_ROWS) ^ rr)",
			"int4-pc-asym", 45, 4096, []string{"gptq"}},
		{"per-channel rows never clamped",
			"GRID == GRID_INT && ok && int_round_exact(lo, p) >= p.nlo && int_round_exact(hi, p) <= p.nhi;", "GRID == GRID_INT && ok;",
			"int4-pc-sym", 45, 4096, []string{"gptq", "qpack"}},
	} {
		t.Run(m.name, func(t *testing.T) {
			if n := bytes.Count(src, []byte(m.old)); n != 1 {
				t.Fatalf("kernels/blockwise.cu holds %q %d times, want once: update the mutant", m.old, n)
			}
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "blockwise.cu"), bytes.Replace(src, []byte(m.old), []byte(m.new), 1), 0o644); err != nil {
				t.Fatal(err)
			}
			bin := hostKernelsFrom(t, dir)
			r := rand.New(rand.NewPCG(rand.Uint64(), 23))
			s, err := quant.ParseScheme(m.scheme)
			if err != nil {
				t.Fatal(err)
			}
			for _, format := range m.formats {
				j, err := newGPUJob("BF16", m.n, m.k, s, format, "m", 0)
				if err != nil {
					t.Fatal(err)
				}
				raw, held := encodeWeights(gpuTestWeights(r, j.n, j.k), "BF16")
				want, err := cpuQuantizePack(held, j.n, j.k, s, format, "m")
				if err != nil {
					t.Fatal(err)
				}
				got, err := hostQuantizePack(bin, j, raw)
				if err != nil {
					t.Fatal(err)
				}
				if len(diffRaws(format, got, want)) == 0 {
					t.Errorf("%s %s: the mutant's output equals the reference", format, m.scheme)
				}
			}
		})
	}
}

// TestKernelsOnCPUReportBadInput checks bw_piece_*'s, bw_rowpc_*'s and bw_bin_*'s reports on the CPU
// (badInputCases).
func TestKernelsOnCPUReportBadInput(t *testing.T) {
	bin := hostKernels(t)
	checkBadInputs(t, func(j gpuJob) bool { return j.pieceKernel()+j.rowpcKernel()+j.binKernel() != "" }, func(j gpuJob, raw []byte) error {
		_, err := hostQuantizePack(bin, j, raw)
		return err
	})
}

// TestKernelArithmeticOnCPU checks nf4_code_table's buckets against nf4_code of the true
// division on every finite BF16 and F16 weight and every 97th finite positive F16 scale (about
// 3·10^7 pairs; `bw-host nf4table DTYPE 1` takes them all, as TestGPURoundExactExhaustive does on
// a GPU), and div_const against the division on every 1001st finite float32 ≥ 0 (`bw-host
// divcheck 1` takes all 8.6·10^9 quotients).
func TestKernelArithmeticOnCPU(t *testing.T) {
	bin := hostKernels(t)
	for _, args := range [][]string{{"nf4table", "0", "97"}, {"nf4table", "1", "97"}, {"divcheck", "1001"}} {
		cmd := exec.Command(bin, args...)
		cmd.Stdin = bytes.NewReader(nf4ThresholdBytes())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
		t.Logf("%v: %s", args, strings.TrimSpace(string(out)))
	}
}
