package blockwise

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// hostCXX names a C++ compiler (g++ 12 or newer: _Float16, C++20) for TestFP4KernelOnCPU and
// TestKernelsOnCPU:
// go test ./blockwise -run FP4KernelOnCPU -args -blockwise.hostcxx=g++
var hostCXX = flag.String("blockwise.hostcxx", "", "compile the kernels for the CPU with this C++ compiler and test them")

// TestFP4KernelOnCPU checks the transcription of the FP4 rules in kernels/microscaled.cu without
// a GPU: the kernel source, compiled for the CPU with kernels/host's stand-ins (each float32
// operation rounded once), codes whole tensors block by block with the kernels' own functions
// (absmax, the E4M3 and E8M0 scales, the BF16 and F16 fast paths with the NVFP4 scale tables,
// and the general path: the reciprocal with its division fallback, the E2M1 code),
// and must give the CPU reference's bytes for every dtype, both grids, computed and given global
// scales, on fp4TestWeights (exact ties included); and the BF16 and F16 fast paths must code every
// BF16 and F16 weight as the general arithmetic does (the harness's exhaustive mode: every MXFP4
// scale, every NVFP4 scale byte under ten global scales); and the kernels themselves, run as thread blocks
// of std::threads (the stand-ins' barriers give __syncthreads and the warps' shuffles), must give
// the same bytes and report non-finite weights where the CPU does. What it cannot check is
// nvcc's compilation and the PTX instructions themselves (their stand-ins follow the PTX
// manual): TestGPUFP4MatchesCPU does on a GPU.
func TestFP4KernelOnCPU(t *testing.T) {
	if *hostCXX == "" {
		t.Skip("-blockwise.hostcxx not set (a C++ compiler to run kernels/microscaled.cu on the CPU)")
	}
	dir := t.TempDir()
	bin := buildFP4Host(t, dir)
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	// The BF16 and F16 fast paths against the kernel's general arithmetic on every BF16 and F16
	// weight: every MXFP4 scale, and the NVFP4 scale bytes the table clears under global scales
	// given (with exact ties: 1, 3), typical (2688/amax for amax around 0.1), computed from
	// amaxes whose scale bytes meet exact ties (fp4TieAmaxes), extreme and random.
	gs := []string{}
	globals := []float32{1, 3, 1344, 2688 / 0.0731, 1e4, 0.37, 2.5e-30, 7.3e20, float32(math.Exp2(r.Float64()*40 - 10)), float32(math.Exp2(r.Float64()*40 - 10))}
	for _, amax := range append(fp4TieAmaxes[:], randomAmax(r, "BF16", 1.0/64, 4), randomAmax(r, "F16", 1.0/256, 4)) {
		globals = append(globals, quant.NVFP4GlobalScale(amax))
	}
	for _, g := range globals {
		gs = append(gs, fmt.Sprintf("%x", math.Float32bits(g)))
	}
	exhaustive := func(bin string) {
		if out, err := exec.Command(bin, append([]string{"exhaustive"}, gs...)...).CombinedOutput(); err != nil {
			t.Fatalf("%s: exhaustive check of the 16-bit fast paths: %v\n%s", bin, err, out)
		} else {
			t.Logf("%s: exhaustive check of the 16-bit fast paths:\n%s", bin, out)
		}
	}
	exhaustive(bin)
	checkNVFP4Tables(t, bin, r)
	// run codes raw block by block, then with the kernels themselves on a grid of 2 thread blocks
	// (grid-stride loops that go round several times), and compares both with the CPU's bytes.
	run := func(bin, what string, w []float32, n, k, dt int, s quant.Scheme, g float32, raw []byte, want []packing.Raw) {
		t.Helper()
		nv := 0
		if s.Grid == quant.NVFP4 {
			nv = 1
		}
		args := []string{fmt.Sprint(nv), fmt.Sprint(n), fmt.Sprint(k), fmt.Sprint(dt), fmt.Sprintf("%x", math.Float32bits(g))}
		for _, mode := range [][]string{args, append(append([]string{"kernel"}, args...), "2")} {
			what := what
			if mode[0] == "kernel" {
				what += " (kernels on 2 thread blocks)"
			}
			cmd := exec.Command(bin, mode...)
			cmd.Stdin = bytes.NewReader(raw)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %s: %v", what, bin, err)
			}
			if mode[0] == "kernel" {
				if status := binary.LittleEndian.Uint64(out[len(out)-8:]); status != math.MaxUint64 {
					t.Errorf("%s: non-finite weight reported at %d", what, status)
				}
				out = out[:len(out)-8]
			}
			codes, scales := out[:n*k/2], out[n*k/2:n*k/2+n*k/s.GroupSize]
			if !bytes.Equal(codes, want[1].Data) {
				t.Errorf("%s: codes differ from the CPU's", what)
			}
			if !bytes.Equal(scales, want[2].Data) {
				t.Errorf("%s: scale bytes differ from the CPU's", what)
			}
			if nv == 1 && !bytes.Equal(out[len(out)-4:], want[3].Data) {
				t.Errorf("%s: global scale %v, CPU %v", what, math.Float32frombits(binary.LittleEndian.Uint32(out[len(out)-4:])),
					math.Float32frombits(binary.LittleEndian.Uint32(want[3].Data)))
			}
		}
	}
	// bw_fp4_amax alone against max |w| (fp4AmaxCases: NaN and infinities, sizes below a thread's
	// tile, between tiles, many tiles) on grids of 1 to 3 thread blocks.
	for i, c := range fp4AmaxCases(r, []int{1, 3, 255, fp4AmaxTile - 1, fp4AmaxTile + 1, 2*fp4AmaxTile + 257, 5*fp4AmaxTile + 3, 5*fp4AmaxTile + 3}) {
		blocks := 1 + i%3
		dt := gpuDTypes[c.dtype].code
		cmd := exec.Command(bin, "amax", fmt.Sprint(dt), fmt.Sprint(len(c.held)/8), fmt.Sprint(blocks))
		cmd.Stdin = bytes.NewReader(c.raw)
		out, err := cmd.Output()
		if err != nil || len(out) != 4 {
			t.Fatalf("%s: %s amax: %v (%d bytes out)", c.what, bin, err, len(out))
		}
		checkAmaxBits(t, fmt.Sprintf("%s (%d thread blocks)", c.what, blocks), binary.LittleEndian.Uint32(out), c.held)
	}
	// A non-finite weight: the kernels report the first one's flat index, as the CPU's error (in
	// an even and in an odd chunk: the BF16 loop's lanes hold two).
	for dt, dtype := range []string{"BF16", "F16", "F32"} {
		for nv, s := range []quant.Scheme{quant.MXFP4Scheme, quant.NVFP4Scheme} {
			for _, col := range []int{70, 78} {
				const n, k = 16, 128
				w := fp4TestWeights(r, n, k)
				w[5*k+col], w[9*k+3] = float32(math.NaN()), float32(math.Inf(1))
				raw, _ := encodeWeights(w, dtype)
				cmd := exec.Command(bin, "kernel", fmt.Sprint(nv), fmt.Sprint(n), fmt.Sprint(k), fmt.Sprint(dt), "0", "2")
				cmd.Stdin = bytes.NewReader(raw)
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("%s %s non-finite: %s: %v", dtype, s, bin, err)
				}
				if status := binary.LittleEndian.Uint64(out[len(out)-8:]); status != uint64(5*k+col) {
					t.Errorf("%s %s: non-finite weight reported at %d, want %d", dtype, s, status, 5*k+col)
				}
			}
		}
	}
	w, differ := nearTieWeights(r, 64, 512, 3)
	if differ == 0 {
		t.Fatal("no weight whose w·(1/f) differs from w/f: the division path would not be tested")
	}
	raw, held := encodeWeights(w, "F32")
	want, err := cpuFP4(held, 64, 512, quant.NVFP4Scheme, "qpack", 3)
	if err != nil {
		t.Fatal(err)
	}
	run(bin, fmt.Sprintf("near ties (%d weights where w·(1/f) ≠ w/f)", differ), w, 64, 512, 2, quant.NVFP4Scheme, 3, raw, want)
	for _, shape := range [][2]int{{1, 32}, {37, 96}, {200, 512}} {
		n, k := shape[0], shape[1]
		w := fp4TestWeights(r, n, k)
		for dt, dtype := range []string{"BF16", "F16", "F32"} {
			raw, held := encodeWeights(w, dtype)
			for _, s := range []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme} {
				globals := []float32{0}
				if s.Grid == quant.NVFP4 {
					globals = append(globals, 1, 1e4)
				}
				for _, g := range globals {
					what := fmt.Sprintf("%dx%d %s %s G=%g", n, k, dtype, s, g)
					want, err := cpuFP4(held, n, k, s, "qpack", g)
					if err != nil {
						t.Fatalf("%s: CPU: %v", what, err)
					}
					run(bin, what, w, n, k, dt, s, g, raw, want)
				}
			}
		}
	}
	// The NVFP4 tables' searches from starting points moved off (harness copies built with
	// NVFP4_SHIFT_R and NVFP4_SHIFT_RH): r from 6 float steps below and above, rh from 24 above
	// and below; and a copy whose rh searches all fail (NVFP4_RH_FAILS), where every byte must
	// go to the general path whatever r's search finds. Each copy's cleared bytes must code every
	// weight exactly, and its kernels must give the CPU's bytes.
	const n, k = 37, 96
	w = fp4TestWeights(r, n, k)
	for _, shift := range [][2]int{{-6, 24}, {6, -24}, {0, 0}} {
		var defines []string
		if shift == [2]int{} {
			defines = []string{"-DNVFP4_SHIFT_R=0", "-DNVFP4_SHIFT_RH=0", "-DNVFP4_RH_FAILS=1"}
		} else {
			defines = []string{fmt.Sprintf("-DNVFP4_SHIFT_R=%d", shift[0]), fmt.Sprintf("-DNVFP4_SHIFT_RH=%d", shift[1]), "-DNVFP4_RH_FAILS=0"}
		}
		bin := buildFP4Host(t, dir, defines...)
		exhaustive(bin)
		for dt, dtype := range []string{"BF16", "F16"} {
			raw, held := encodeWeights(w, dtype)
			for _, g := range []float32{0, 1e4} {
				what := fmt.Sprintf("%dx%d %s NVFP4 G=%g, harness built with %v", n, k, dtype, g, defines)
				want, err := cpuFP4(held, n, k, quant.NVFP4Scheme, "qpack", g)
				if err != nil {
					t.Fatalf("%s: CPU: %v", what, err)
				}
				run(bin, what, w, n, k, dt, quant.NVFP4Scheme, g, raw, want)
			}
		}
	}
}

// buildFP4Host compiles the host harness into dir with the given preprocessor definitions (none:
// as the kernels).
func buildFP4Host(t *testing.T, dir string, defines ...string) string {
	t.Helper()
	bin := filepath.Join(dir, "fp4-host"+strings.Join(defines, ""))
	args := append([]string{"-O2", "-ffp-contract=off", "-std=c++20", "-pthread", "-I", "kernels/host", "-I", "kernels"}, defines...)
	cmd := exec.Command(*hostCXX, append(args, "-o", bin, "kernels/host/microscaled_host.cpp")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd, err, out)
	}
	return bin
}

// fp4TieAmaxes are BF16 amaxes under whose global scale 2688/amax many NVFP4 scale bytes meet
// exact ties (f = s·amax/2688 has as few bits as a BF16 weight, so 0.25·f, 0.75·f, … are
// weights): BenchmarkGPUQuantizeFP4's BF16 amax (mantissa 225 = 3·75), a power of two, and
// mantissas 140 = 7·20 and 144 = 3·48.
var fp4TieAmaxes = [...]float32{0.10986328125, 0.0625, 0.068359375, 0.0703125}

// randomAmax is a random magnitude in [lo, hi), log-uniform, rounded to BF16 or F16.
func randomAmax(r *rand.Rand, dtype string, lo, hi float64) float32 {
	v := float32(lo * math.Pow(hi/lo, r.Float64()))
	if dtype == "BF16" {
		return fp.BF16ToF32(fp.F32ToBF16(v))
	}
	return fp.F16ToF32(fp.F32ToF16(v))
}

// checkNVFP4Tables asks the harness which NVFP4 scale bytes the BF16 and F16 tables send to the
// general path under the global scale 2688/amax of amaxes a tensor has: BenchmarkGPUQuantizeFP4's,
// every BF16 mantissa in two binades and random F16 ones. A block whose byte is sent there
// costs its whole warp the general path, so only bytes that the arithmetic excludes may be:
// 1 to 3 (subnormal E4M3 scales, whose blocks may hold weights up to 9·f, past the fast code's
// 7) and, for F16, the bytes below 32, whose blocks lie under amax/3584 and hold F16 subnormals
// with few bits.
func checkNVFP4Tables(t *testing.T, bin string, r *rand.Rand) {
	amaxes := []float32{0.10986328125}
	for m := uint32(0); m < 256; m++ {
		amaxes = append(amaxes, math.Float32frombits(0x3d800000+m<<16)) // [2^-4, 2^-2)
	}
	for range 64 {
		amaxes = append(amaxes, randomAmax(r, "F16", 1.0/256, 4))
	}
	args := []string{}
	for _, a := range amaxes {
		args = append(args, fmt.Sprintf("%x", math.Float32bits(quant.NVFP4GlobalScale(a))))
	}
	for dt, dtype := range []string{"BF16", "F16"} {
		out, err := exec.Command(bin, append([]string{"slow", fmt.Sprint(dt)}, args...)...).Output()
		if err != nil {
			t.Fatalf("%s: slow %s: %v", bin, dtype, err)
		}
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(lines) != len(amaxes) {
			t.Fatalf("slow %s: %d lines for %d global scales", dtype, len(lines), len(amaxes))
		}
		for i, line := range lines {
			for _, f := range strings.Fields(line) {
				b, _ := strconv.Atoi(f)
				if b > 3 && (dt == 0 || b >= 32) {
					t.Errorf("NVFP4 %s, amax %v (G %v): scale byte %d takes the general path (all slow: %s)", dtype, amaxes[i],
						quant.NVFP4GlobalScale(amaxes[i]), b, line)
					break
				}
			}
		}
	}
}
