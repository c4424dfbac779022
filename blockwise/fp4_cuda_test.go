package blockwise

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// gpuFP4PTX lets a GPU run try FP4 kernels compiled there before the embedded PTX is
// regenerated: go test -args -blockwise.fp4ptx=/path/microscaled.ptx
var gpuFP4PTX = flag.String("blockwise.fp4ptx", "", "load this PTX instead of the embedded kernels/microscaled.ptx")

func TestFP4PTXIsFresh(t *testing.T) {
	if err := cuda.CheckPTX(microscaledPTX, microscaledSource); err != nil {
		t.Fatalf("kernels/microscaled.ptx: %v", err)
	}
	if err := cuda.CheckCubin(microscaledCubinSM90, microscaledPTX); err != nil {
		t.Fatalf("kernels/microscaled.sm_90.cubin: %v", err)
	}
}

// fp4TestWeights returns n×k weights (k a multiple of 32) whose rows hit the FP4 rules' edges:
// Gaussian rows over 2^−24 … 2^6, all-zero blocks, tiny rows (scales at E4M3's and E8M0's
// bottom), outliers, and rows of exact ties: values c·2^e with c on every E2M1 decision
// threshold and each block's maximum 6·2^e, so that w/scale lands on the thresholds exactly
// (for NVFP4 with global scale 1; the kernels' division path).
func fp4TestWeights(r *rand.Rand, n, k int) []float32 {
	ties := []float32{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, 0.5, 3}
	w := make([]float32, n*k)
	for row := range n {
		mag := math.Exp2(r.Float64()*30 - 24)
		e := float32(math.Exp2(float64(r.IntN(12) - 8)))
		for c := range k {
			v := float32(r.NormFloat64() * mag)
			switch row % 6 {
			case 1:
				if c%32 < 16 {
					v = 0
				}
			case 2:
				v *= 1e-30
			case 3:
				if r.IntN(40) == 0 {
					v *= 50
				}
			case 4, 5:
				v = ties[r.IntN(len(ties))] * e
				if c%16 == 0 {
					v = 6 * e
				}
			}
			w[row*k+c] = v
		}
	}
	return w
}

// nearTieWeights returns n×k F32 weights for NVFP4 under global scale g whose quotients w/f
// (f = s/g, the block's factor) lie within 3 ulps of the E2M1 decision thresholds: the weights
// for which w·(1/f) and w/f may code differently. It also returns how many do differ, which a
// test needs to be above 0 for the division path to be exercised.
func nearTieWeights(r *rand.Rand, n, k int, g float32) (w []float32, differ int) {
	ties := []float32{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5}
	w = make([]float32, n*k)
	for b := 0; b < n*k; b += 16 {
		amax := float32(math.Exp2(r.Float64()*8 - 4))
		f := quant.NVFP4BlockScale(amax, g) / g
		w[b] = amax
		for i := 1; i < 16; i++ {
			v := ties[r.IntN(len(ties))] * f
			for range r.IntN(7) - 3 + 3 {
				v = math.Nextafter32(v, float32(math.Inf(1)))
			}
			for range 3 {
				v = math.Nextafter32(v, 0)
			}
			v = min(v, amax)
			if r.IntN(2) == 0 {
				v = -v
			}
			w[b+i] = v
			if v*(1/f) != v/f {
				differ++
			}
		}
	}
	return w, differ
}

// fp4AmaxCase is one input of the amax kernel's tests: chunks·8 weights as held in dtype.
type fp4AmaxCase struct {
	what  string
	dtype string
	raw   []byte
	held  []float32
}

// fp4AmaxCases returns, for every dtype and each size in chunks, weights of one kind in turn:
// Gaussian of a random magnitude (the largest |w| at a random place, either sign), tiny
// (subnormal in every dtype), all zero, a NaN, an infinity of either sign, both.
func fp4AmaxCases(r *rand.Rand, sizes []int) []fp4AmaxCase {
	var cases []fp4AmaxCase
	for i, chunks := range sizes {
		for d, dtype := range []string{"BF16", "F16", "F32"} {
			kind := (i + d) % 6
			w := make([]float32, 8*chunks)
			mag := math.Exp2(r.Float64()*20 - 10)
			if kind == 1 {
				mag = 1e-41
				if dtype == "F16" {
					mag = 1e-6
				}
			}
			for j := range w {
				if kind != 2 {
					w[j] = float32(r.NormFloat64() * mag)
				}
			}
			peak := r.IntN(len(w))
			w[peak] = -w[peak] * 4
			switch kind {
			case 3:
				w[r.IntN(len(w))] = float32(math.NaN())
			case 4:
				w[r.IntN(len(w))] = float32(math.Inf(1 - 2*r.IntN(2)))
			case 5:
				w[r.IntN(len(w))] = float32(math.NaN())
				w[r.IntN(len(w))] = float32(math.Inf(-1))
			}
			raw, held := encodeWeights(w, dtype)
			what := fmt.Sprintf("%s %d chunks %s", dtype, chunks, []string{"Gaussian", "tiny", "zero", "NaN", "Inf", "NaN and -Inf"}[kind])
			cases = append(cases, fp4AmaxCase{what, dtype, raw, held})
		}
	}
	return cases
}

// checkAmaxBits compares bw_fp4_amax's word with the bits of max |w| over held (float32 bits
// of magnitudes order like the values): equal when every weight is finite or the largest is an
// infinity, and above +Inf's bits (a NaN's) when a weight is NaN.
func checkAmaxBits(t *testing.T, what string, got uint32, held []float32) {
	t.Helper()
	var want uint32
	for _, v := range held {
		want = max(want, math.Float32bits(v)&0x7fffffff)
	}
	if want > 0x7f800000 && got <= 0x7f800000 || want <= 0x7f800000 && got != want {
		t.Errorf("%s: amax bits %#08x, want %#08x", what, got, want)
	}
}

// cpuFP4 is the reference: Quantize with the global scale (0: from the tensor), then Pack.
func cpuFP4(w []float32, n, k int, s quant.Scheme, format string, global float32) ([]packing.Raw, error) {
	t, err := Quantize(w, n, k, s, Options{GlobalScale: global})
	if err != nil {
		return nil, err
	}
	f, _ := packing.Lookup(format)
	return f.Pack("m", t)
}

// gpuFP4 quantizes and packs raw on the GPU with global scale g, copying the results out.
func gpuFP4(q *GPUQuantizer, raw []byte, dtype string, n, k int, s quant.Scheme, format string, g float32) ([]packing.Raw, error) {
	var got []packing.Raw
	err := q.QuantizePackScaled(func(dst []byte) error { copy(dst, raw); return nil }, dtype, n, k, s, format, "m", g,
		func(raws []packing.Raw) error {
			for _, r := range raws {
				r.Data = append([]byte(nil), r.Data...)
				got = append(got, r)
			}
			return nil
		})
	return got, err
}

// TestGPUFP4MatchesCPU: every dtype, both grids and layouts, computed and given global scales,
// shapes with partial warps and several warps a row, on fresh random weights: the GPU's packed
// tensors equal the CPU reference byte for byte.
func TestGPUFP4MatchesCPU(t *testing.T) {
	_, q := openGPUQuantizer(t)
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	for _, shape := range [][2]int{{1, 32}, {37, 96}, {64, 4096}, {300, 1344}} {
		n, k := shape[0], shape[1]
		w := fp4TestWeights(r, n, k)
		for _, dtype := range []string{"BF16", "F16", "F32"} {
			raw, held := encodeWeights(w, dtype)
			for _, s := range []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme} {
				for _, format := range []string{"qpack", "compressed-tensors"} {
					globals := []float32{0}
					if s.Grid == quant.NVFP4 {
						globals = append(globals, 1, 1e4)
					}
					for _, g := range globals {
						what := fmt.Sprintf("%dx%d %s %s %s G=%g", n, k, dtype, s, format, g)
						want, err := cpuFP4(held, n, k, s, format, g)
						if err != nil {
							t.Fatalf("%s: CPU: %v", what, err)
						}
						got, err := gpuFP4(q, raw, dtype, n, k, s, format, g)
						if err != nil {
							t.Fatalf("%s: GPU: %v", what, err)
						}
						compareRaws(t, what, got, want)
					}
				}
			}
		}
	}
}

// TestGPUFP4Amax: bw_fp4_amax against max |w| on fresh random weights of every dtype, with NaN
// and infinities, sizes below one thread's tile, between tiles and of many tiles (several
// hundred thread blocks whose atomics race on the word).
func TestGPUFP4Amax(t *testing.T) {
	dev, q := openGPUQuantizer(t)
	if err := q.fp4.load(dev); err != nil {
		t.Fatal(err)
	}
	st, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer dev.DestroyStream(st)
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	sizes := []int{1, 3, 255, fp4AmaxTile - 1, fp4AmaxTile, fp4AmaxTile + 1, 2*fp4AmaxTile + 257, 100003, 3<<20 + 5}
	sizes = append(sizes, sizes[len(sizes)-3:]...) // the larger sizes again: more kinds of weights for each dtype
	for _, c := range fp4AmaxCases(r, sizes) {
		j := gpuJob{n: 1, k: len(c.held), dtype: gpuDTypes[c.dtype].code} // what launchFP4Amax reads
		var ptrs [numBufs]cuda.DevicePtr
		var err error
		if ptrs[bufInput], err = dev.Alloc(len(c.raw)); err != nil {
			t.Fatal(err)
		}
		if ptrs[bufParamScale], err = dev.Alloc(4); err != nil {
			t.Fatal(err)
		}
		word := make([]byte, 4)
		err = dev.CopyToDevice(ptrs[bufInput], c.raw)
		if err == nil {
			err = dev.CopyToDevice(ptrs[bufParamScale], word)
		}
		if err == nil {
			err = q.launchFP4Amax(j, ptrs, st)
		}
		if err == nil {
			err = dev.SynchronizeStream(st)
		}
		if err == nil {
			err = dev.CopyFromDevice(word, ptrs[bufParamScale])
		}
		dev.Free(ptrs[bufInput])
		dev.Free(ptrs[bufParamScale])
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		checkAmaxBits(t, fmt.Sprintf("%s (%d blocks)", c.what, fp4AmaxBlocks(j.fp4Vectors(), dev.Info().Multiprocessors)),
			binary.LittleEndian.Uint32(word), c.held)
	}
}

// fp4AmaxBlocks gives every block the same whole tiles give or take one, in one wave.
func TestFP4AmaxBlocks(t *testing.T) {
	for _, sms := range []int{1, 7, 132} {
		for _, vecs := range []uint64{1, 255, 256, 257, fp4AmaxTile - 1, fp4AmaxTile, 3*fp4AmaxTile + 5, 1 << 20, 6291456, 12582912, 1<<32 - 3} {
			blocks := fp4AmaxBlocks(vecs, sms)
			tiles := vecs / fp4AmaxTile
			if blocks < 1 || blocks > max(sms*fp4BlocksPerSM, 1) && tiles > 0 {
				t.Errorf("%d SMs, %d vectors: %d blocks", sms, vecs, blocks)
			}
			if tiles == 0 {
				if uint64(blocks)*fp4Threads < vecs {
					t.Errorf("%d SMs, %d vectors: %d blocks leave vectors without a thread", sms, vecs, blocks)
				}
				continue
			}
			most, least := (tiles+uint64(blocks)-1)/uint64(blocks), tiles/uint64(blocks)
			if least == 0 || most > least+1 {
				t.Errorf("%d SMs, %d tiles: %d blocks take %d to %d tiles", sms, tiles, blocks, least, most)
			}
		}
	}
}

// Weights whose reciprocal-multiplied quotients are off by an ulp near the E2M1 thresholds
// take the kernel's division path and still code as the CPU does.
func TestGPUNVFP4NearTies(t *testing.T) {
	_, q := openGPUQuantizer(t)
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	const n, k, g = 64, 512, 3
	w, differ := nearTieWeights(r, n, k, g)
	if differ == 0 {
		t.Fatal("no weight whose w·(1/f) differs from w/f: the test would not exercise the division")
	}
	raw, held := encodeWeights(w, "F32")
	want, err := cpuFP4(held, n, k, quant.NVFP4Scheme, "qpack", g)
	if err != nil {
		t.Fatal(err)
	}
	got, err := gpuFP4(q, raw, "F32", n, k, quant.NVFP4Scheme, "qpack", g)
	if err != nil {
		t.Fatal(err)
	}
	compareRaws(t, fmt.Sprintf("near ties (%d weights where w·(1/f) ≠ w/f)", differ), got, want)
}

// A non-finite weight is the CPU's error, at the same row and column.
func TestGPUFP4NonFinite(t *testing.T) {
	_, q := openGPUQuantizer(t)
	const n, k = 16, 128
	for _, dtype := range gpuDTypeNames {
		for _, s := range []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme} {
			w := fp4TestWeights(rand.New(rand.NewPCG(1, 2)), n, k)
			w[5*k+70], w[9*k+3] = float32(math.NaN()), float32(math.Inf(1))
			raw, held := encodeWeights(w, dtype)
			_, cpuErr := cpuFP4(held, n, k, s, "qpack", 0)
			_, err := q.QuantizePack(raw, dtype, n, k, s, "qpack", "m")
			if err == nil || cpuErr == nil || !strings.Contains(err.Error(), "row 5, column 70") || !strings.Contains(cpuErr.Error(), "row 5, column 70") {
				t.Errorf("%s %s: GPU error %v, CPU error %v; want both at row 5, column 70", dtype, s, err, cpuErr)
			}
		}
	}
}

// The FP4 jobs refuse other formats, partial blocks and misplaced global scales.
func TestGPUFP4Refusals(t *testing.T) {
	for _, c := range []struct {
		s      quant.Scheme
		format string
		k      int
		global float32
		want   string
	}{
		{quant.NVFP4Scheme, "gptq", 64, 0, "format qpack or compressed-tensors"},
		{quant.MXFP4Scheme, "qpack", 48, 0, "whole blocks"},
		{quant.MXFP4Scheme, "qpack", 64, 2, "global scale"},
		{quant.NVFP4Scheme, "qpack", 64, float32(math.Inf(1)), "global scale"},
		{quant.Scheme{Bits: 4, GroupSize: 32}, "qpack", 64, 2, "global scale"},
	} {
		if _, err := newGPUJob("BF16", 4, c.k, c.s, c.format, "m", c.global); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s K=%d G=%g: %v, want an error with %q", c.s, c.format, c.k, c.global, err, c.want)
		}
	}
	var q GPUQuantizer
	for _, f := range []string{"qpack", "compressed-tensors"} {
		if !q.Supports(quant.NVFP4Scheme, f) || !q.Supports(quant.MXFP4Scheme, f) {
			t.Errorf("Supports FP4 in %s: false", f)
		}
	}
	if q.Supports(quant.NVFP4Scheme, "gptq") || q.Supports(quant.FP8BlockScheme(128), "qpack") {
		t.Error("Supports FP4 in gptq or block FP8")
	}
}

// BenchmarkGPUQuantizeFP4 is BenchmarkGPUQuantize's measure (device-resident inputs, input plus
// packed output bytes over the median CUDA-event time, against a device-to-device copy of the
// same inputs in the same run) for NVFP4 with the global scale computed (two reads of W:
// bw_fp4_amax, then the quantization; its TABLE line also gives the rate with both reads
// counted, and two more lines each pass alone) and given (one read, as convert gives it), and
// MXFP4, at 50M and 180M weights, for BF16, F16 and F32 inputs. Run with -test.benchtime=1x;
// each sub-benchmark prints a TABLE line; -test.bench 'GPUQuantizeFP4/.*/BF16' picks a dtype.
func BenchmarkGPUQuantizeFP4(b *testing.B) {
	dev, q := openGPUQuantizer(b)
	if err := q.fp4.load(dev); err != nil {
		b.Fatal(err)
	}
	big, err := dev.CopyBandwidth(1<<30, 21)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("TABLE %s: D2D copy 1 GiB: %.2f TB/s\n", dev.Info().Name, big.BytesPerSecond()/1e12)
	for _, size := range []struct {
		label string
		n, k  int
	}{{"50M", 8192, 6144}, {"180M", 4 * 11008, 4096}} {
		for _, dtype := range gpuDTypeNames {
			for _, c := range []struct {
				s      quant.Scheme
				global float32
				label  string
			}{{quant.NVFP4Scheme, 0, "amax"}, {quant.NVFP4Scheme, 1344, "given"}, {quant.MXFP4Scheme, 0, ""}} {
				b.Run(fmt.Sprintf("%s/%s/%s%s", size.label, dtype, c.s, c.label), func(b *testing.B) {
					j, err := newGPUJob(dtype, size.n, size.k, c.s, "qpack", "bench", c.global)
					if err != nil {
						b.Fatal(err)
					}
					benchGPUJob(b, dev, q, fmt.Sprintf("%s %s %s", size.label, dtype, c.label), j)
				})
			}
		}
	}
}
