package gptq

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/quant"
)

// fitSearchOnGPU runs gptq_fit_search alone over every group of W[n, k] (groups of s along
// each row, dead columns zeroed when dead is given), with importance imp (nil: none) and the
// imatrix search or the MSE one, and returns the scales, zero points and overflow status.
func fitSearchOnGPU(t *testing.T, g *GPUSolver, w []float32, n, k int, s quant.Scheme, weighted bool, dead []bool, imp []float32) ([]float32, []uint8, uint64) {
	t.Helper()
	perm := make([]int, k)
	for i := range perm {
		perm[i] = i
	}
	p := gpuPlan{n: n, k: k, s: s, opt: Options{}.withDefaults(), lay: newLayout(s, k, perm, true), search: true}
	p.useFMA, _ = clipPowPath()
	ptr, err := g.allocate(p)
	if err != nil {
		t.Fatal(err)
	}
	mask := make([]byte, k)
	for c := range dead {
		if dead[c] {
			mask[c] = 1
		}
	}
	for _, u := range []struct {
		slot int
		data []byte
	}{{slotOrig, cuda.Bytes(w)}, {slotDead, mask}, {slotImpOrig, cuda.Bytes(imp)}} {
		if err := g.dev.CopyToDevice(ptr[u.slot], u.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.dev.Fill32(ptr[slotFlags], math.MaxUint32, 2); err != nil {
		t.Fatal(err)
	}
	deadPtr, impPtr, wArg, fma, sym := ptr[slotDead], ptr[slotImpOrig], int32(0), int32(0), int32(0)
	if dead == nil {
		deadPtr = 0
	}
	if imp == nil {
		impPtr = 0
	}
	if weighted {
		wArg = 1
	}
	if p.useFMA {
		fma = 1
	}
	if s.Sym {
		sym = 1
	}
	groups := s.Groups(k)
	err = g.fn.fitSearch.Launch(cuda.Dim3{X: (n*groups + 7) / 8, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, g.stream,
		ptr[slotOrig], deadPtr, impPtr, int32(n), int32(k), int32(p.lay.size), int32(groups), int32(0), int32(groups),
		wArg, fma, int32(s.Bits), sym, ptr[slotScales], ptr[slotZeros], ptr[slotFlags])
	if err == nil {
		err = g.dev.SynchronizeStream(g.stream)
	}
	if err != nil {
		t.Fatal(err)
	}
	scales, zeros, status := make([]float32, n*groups), make([]uint8, n*groups), make([]byte, 8)
	for _, c := range []struct {
		dst []byte
		src cuda.DevicePtr
	}{{cuda.Bytes(scales), ptr[slotScales]}, {zeros, ptr[slotZeros]}, {status, ptr[slotFlags]}} {
		if err := g.dev.CopyFromDevice(c.dst, c.src); err != nil {
			t.Fatal(err)
		}
	}
	return scales, zeros, binary.LittleEndian.Uint64(status)
}

// awkwardWeights returns random heavy-tailed weights with the groups a search can trip on:
// all zeros, −0, one repeated value, one non-zero weight, values so small that the scale is
// F16's smallest subnormal, and one row whose first group's scale overflows F16.
func awkwardWeights(r *rand.Rand, n, k int) []float32 {
	w := randomWeights(r, n, k)
	for i := range w {
		if r.IntN(50) == 0 {
			w[i] *= 10
		}
	}
	row := func(i int) []float32 { return w[i%n*k : i%n*k+k] }
	clear(row(1)[:40])
	row(2)[3] = float32(math.Copysign(0, -1))
	for c := range 40 {
		row(3)[c] = 0.01
		row(4)[c] = 0
		row(5)[c] = float32(r.NormFloat64() * 1e-9)
	}
	row(4)[17] = -0.03
	row(6)[5] = 1e8 // the scale overflows F16 at every width, however shrunk
	return w
}

// TestGPUFitSearchMatchesCPU: gptq_fit_search gives, group for group, blockwise.GroupParams's
// scale and zero point bit for bit — the imatrix search and the MSE clip search, with and
// without importance (zeros in it) and dead columns, every integer width, both symmetries,
// groups that end early and per-channel — and flags the first group whose scale overflows.
func TestGPUFitSearchMatchesCPU(t *testing.T) {
	_, g := openGPUSolver(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 21))
	const n, k = 41, 300
	schemes := []quant.Scheme{{Bits: 2, GroupSize: 64}, {Bits: 3, GroupSize: 128}, {Bits: 3, GroupSize: 32, Sym: true},
		{Bits: 4, GroupSize: 96}, {Bits: 4, GroupSize: 128, Sym: true}, {Bits: 5, GroupSize: 8}, {Bits: 8, GroupSize: 64, Sym: true},
		{Bits: 6, GroupSize: 256}, {Bits: 4, GroupSize: quant.PerChannel}, {Bits: 3, GroupSize: quant.PerChannel, Sym: true}}
	for _, s := range schemes {
		for _, weighted := range []bool{true, false} {
			for _, withImp := range []bool{true, false} {
				name := fmt.Sprintf("%s/weighted=%v/importance=%v", s, weighted, withImp)
				t.Run(name, func(t *testing.T) {
					w := awkwardWeights(r, n, k)
					var imp []float32
					if withImp {
						imp = make([]float32, k)
						for c := range imp {
							imp[c] = float32(math.Exp(3 * r.NormFloat64()))
						}
						imp[11], imp[200] = 0, 0
					}
					var dead []bool
					if r.IntN(2) == 0 {
						dead = make([]bool, k)
						dead[7], dead[k-2] = true, true
					}
					scales, zeros, status := fitSearchOnGPU(t, g, w, n, k, s, weighted, dead, imp)
					groups, size := s.Groups(k), s.GroupSize
					if size == quant.PerChannel {
						size = k
					}
					opt := blockwise.Options{Imatrix: weighted, Clip: !weighted}
					row, codes := make([]float32, k), make([]uint8, k)
					firstInf := uint64(math.MaxUint64)
					for rr := range n {
						copy(row, w[rr*k:(rr+1)*k])
						for c := range dead {
							if dead[c] {
								row[c] = 0
							}
						}
						for gi := range groups {
							lo, hi := gi*size, min((gi+1)*size, k)
							var im []float32
							if imp != nil {
								im = imp[lo:hi]
							}
							scale, zero := blockwise.GroupParams(s, row[lo:hi], im, opt, codes)
							at := rr*groups + gi
							if math.Float32bits(scales[at]) != math.Float32bits(scale) || zeros[at] != zero {
								t.Fatalf("row %d group %d: GPU scale %g zero %d, CPU %g %d", rr, gi, scales[at], zeros[at], scale, zero)
							}
							if math.IsInf(float64(scale), 0) && firstInf == math.MaxUint64 {
								firstInf = uint64(at)
							}
						}
					}
					if status != firstInf {
						t.Errorf("overflow status %d, want %d (the first group with an infinite scale)", status, firstInf)
					}
				})
			}
		}
	}
}

// TestGPUSearchedGroupsMatchCPU: GPTQ with the Weighted and the MSE group fits on the GPU
// against the CPU solver, in every layout — on-the-fly groups of 32, 64 and 128 (those of 32
// and 64 start inside a 128-column block), static groups, per-channel, with and without
// act-order — asymmetric and symmetric, K not a multiple of the group size or of the block,
// dead columns. With K ≤ 128 (one block: every group is fitted from the weights as loaded) and
// for groups fitted before the column loop every group parameter must equal the CPU's; later
// on-the-fly groups see weights that the trailing GEMM (and cuSOLVER's factor) rounded
// differently, and codes may differ near ties (compareWithCPU's limits).
func TestGPUSearchedGroupsMatchCPU(t *testing.T) {
	_, g := openGPUSolver(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 22))
	for _, shape := range [][2]int{{77, 300}, {45, 100}} {
		n, k := shape[0], shape[1]
		h := testHessian(t, r, k)
		killColumns(h, k, 7, k-2)
		for _, search := range []string{"weighted", "mse"} {
			for _, sym := range []bool{false, true} {
				for _, gs := range []int{32, 64, 128, quant.PerChannel} {
					for _, o := range []Options{{}, {ActOrder: true}, {StaticGroups: true}, {ActOrder: true, StaticGroups: true}} {
						if gs == quant.PerChannel && o.StaticGroups {
							continue
						}
						bits := 3
						if sym {
							bits = 4
						}
						if gs == 64 {
							bits = 2
						}
						s := quant.Scheme{Bits: bits, GroupSize: gs, Sym: sym}
						o.Imatrix, o.Clip = search == "weighted", search == "mse"
						t.Run(fmt.Sprintf("%dx%d/%s/%s/act=%v/static=%v", n, k, s, search, o.ActOrder, o.StaticGroups), func(t *testing.T) {
							w := randomWeights(r, n, k)
							codes, params := compareWithCPUCounts(t, g, w, n, k, h, s, o)
							t.Logf("%d of %d codes differ, %d of %d group parameters", codes, n*k, params, n*s.Groups(k))
							fixed := o.StaticGroups || gs == quant.PerChannel
							if (fixed || k <= gpuBlockSize) && params != 0 {
								t.Errorf("%d group parameters differ from the CPU's; want none", params)
							}
						})
					}
				}
			}
		}
	}
}
