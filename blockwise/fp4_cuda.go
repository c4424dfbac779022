package blockwise

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/microscaled.cu

var (
	//go:embed kernels/microscaled.ptx
	microscaledPTX []byte
	//go:embed kernels/microscaled.sm_90.cubin
	microscaledCubinSM90 []byte // the PTX assembled for the H100/H200
	//go:embed kernels/microscaled.cu
	microscaledSource []byte
)

// fp4Threads is FP4_THREADS of kernels/microscaled.cu; fp4BlocksPerSM the blocks per SM of its
// grid-stride launches, fp4NVFP4BlocksPerSM those of the NVFP4 kernels: their
// __launch_bounds__ promise that 4 fit at once, so the grid is one wave and each block builds
// its scale table (BF16) once. fp4AmaxTile is the vectors (16 bytes) a block of bw_fp4_amax
// reads at a time (FP4_AMAX_LOADS·FP4_THREADS); its __launch_bounds__ promise 8 blocks an SM.
const (
	fp4Threads          = 256
	fp4BlocksPerSM      = 8
	fp4NVFP4BlocksPerSM = 4
	fp4AmaxTile         = 8 * fp4Threads
)

// fp4Kernels are the FP4 kernels (kernels/microscaled.cu), by dtype code. The module is loaded
// on the first FP4 tensor, so that other conversions do not pay for its JIT compilation.
type fp4Kernels struct {
	once   sync.Once
	err    error
	images [][]byte // the PTX, then cubins assembled from it
	module *cuda.Module
	nvfp4  [3]cuda.Function
	mxfp4  [3]cuda.Function
	amax   [3]cuda.Function
}

// load loads the module once on dev and returns the kernels or the error.
func (k *fp4Kernels) load(dev *cuda.Device) error {
	k.once.Do(func() {
		m, err := dev.LoadModuleFor(k.images[0], k.images[1:]...)
		if err != nil {
			k.err = fmt.Errorf("blockwise: loading kernels/microscaled.ptx: %w", err)
			return
		}
		for code, suffix := range kernelSuffixes {
			for _, f := range []struct {
				dst  *cuda.Function
				name string
			}{{&k.nvfp4[code], "bw_fp4_nvfp4"}, {&k.mxfp4[code], "bw_fp4_mxfp4"}, {&k.amax[code], "bw_fp4_amax"}} {
				if *f.dst, err = m.Function(f.name + suffix); err != nil {
					m.Unload()
					k.err = err
					return
				}
			}
		}
		k.module = m
	})
	return k.err
}

func (k *fp4Kernels) unload() error {
	if k.module == nil {
		return nil
	}
	err := k.module.Unload()
	k.module = nil
	return err
}

// fp4Format reports whether format holds FP4 tensors the GPU packs: qpack and
// compressed-tensors store the same bytes (packing/microscaled.go) under different names.
func fp4Format(format string) bool { return format == "qpack" || format == "compressed-tensors" }

// checkFP4Job refuses what the FP4 kernels cannot do, before anything is uploaded.
func checkFP4Job(j gpuJob, format string) error {
	if !fp4Format(format) {
		return fmt.Errorf("tensor %s: the GPU quantizer packs %s in format qpack or compressed-tensors, not %q", j.prefix, j.s, format)
	}
	if j.fp4Chunks() >= 1<<31 {
		return fmt.Errorf("tensor %s: %d×%d weights are more than the FP4 kernels index (2^34)", j.prefix, j.n, j.k)
	}
	if j.global != 0 && (j.s.Grid != quant.NVFP4 || !(j.global > 0) || math.IsInf(float64(j.global), 0)) {
		return fmt.Errorf("tensor %s: global scale %g given for %s (NVFP4 takes a finite positive one)", j.prefix, j.global, j.s)
	}
	return nil
}

// fp4Chunks is the number of 8-weight chunks of the job's tensor.
func (j gpuJob) fp4Chunks() uint64 { return uint64(j.n) * uint64(j.k) / 8 }

// fp4DeviceBytes sizes the device buffers of an FP4 job: codes, scale bytes, the global scale
// written back (bufOffsets), the amax or given global scale word (bufParamScale) and status.
func (j gpuJob) fp4DeviceBytes() [numBufs]int {
	var sz [numBufs]int
	sz[bufInput] = j.n * j.k * [3]int{2, 2, 4}[j.dtype]
	sz[bufCodes] = j.n * j.k / 2
	sz[bufScales] = j.n * j.k / j.s.GroupSize
	if j.s.Grid == quant.NVFP4 {
		sz[bufOffsets] = 4
	}
	sz[bufParamScale] = 4
	sz[bufStatus] = statusBytes
	return sz
}

// fp4InitWord is what the job's amax-or-global word holds before the kernels run: the given
// global scale's bits, or 0 for bw_fp4_amax to raise.
func (j gpuJob) fp4InitWord() []byte {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, math.Float32bits(j.global))
	return b
}

// enqueueFP4 launches an FP4 job: NVFP4 without a given global scale first reduces amax(W).
func (q *GPUQuantizer) enqueueFP4(j gpuJob, ptrs [numBufs]cuda.DevicePtr, st cuda.Stream) error {
	if j.s.Grid == quant.NVFP4 && j.global == 0 {
		if err := q.launchFP4Amax(j, ptrs, st); err != nil {
			return err
		}
	}
	return q.launchFP4Quantize(j, ptrs, st)
}

// launchFP4Amax raises the job's amax word (0 before) to the bits of max |w| (bw_fp4_amax).
func (q *GPUQuantizer) launchFP4Amax(j gpuJob, ptrs [numBufs]cuda.DevicePtr, st cuda.Stream) error {
	chunks := j.fp4Chunks()
	grid := cuda.Dim3{X: fp4AmaxBlocks(j.fp4Vectors(), q.dev.Info().Multiprocessors), Y: 1, Z: 1}
	return q.fp4.amax[j.dtype].Launch(grid, cuda.Dim3{X: fp4Threads, Y: 1, Z: 1}, 0, st, ptrs[bufInput], chunks, ptrs[bufParamScale])
}

// launchFP4Quantize launches the job's quantization kernel, which reads the global scale (given)
// or amax(W) (launchFP4Amax's) from the job's amax-or-global word.
func (q *GPUQuantizer) launchFP4Quantize(j gpuJob, ptrs [numBufs]cuda.DevicePtr, st cuda.Stream) error {
	k := &q.fp4
	chunks := j.fp4Chunks()
	perSM, fn := fp4BlocksPerSM, k.mxfp4[j.dtype]
	if j.s.Grid == quant.NVFP4 {
		perSM, fn = fp4NVFP4BlocksPerSM, k.nvfp4[j.dtype]
	}
	blocks := int(min(uint64(q.dev.Info().Multiprocessors*perSM), (chunks+fp4Threads-1)/fp4Threads))
	haveG := int32(0)
	if j.global != 0 {
		haveG = 1
	}
	return fn.Launch(cuda.Dim3{X: max(blocks, 1), Y: 1, Z: 1}, cuda.Dim3{X: fp4Threads, Y: 1, Z: 1}, 0, st,
		ptrs[bufInput], chunks, ptrs[bufParamScale], haveG, ptrs[bufCodes], ptrs[bufScales], ptrs[bufOffsets], ptrs[bufStatus])
}

// fp4Vectors is the number of 16-byte vectors of the job's input (bw_fp4_amax's unit).
func (j gpuJob) fp4Vectors() uint64 {
	if j.dtype == gpuDTypes["F32"].code {
		return 2 * j.fp4Chunks()
	}
	return j.fp4Chunks()
}

// fp4AmaxBlocks sizes bw_fp4_amax's grid for vecs vectors on sms multiprocessors: at most 8
// blocks an SM (one wave), each taking the same number of whole tiles (rounds) give or take
// one, so that no block reads twice the others'. Under one tile, the grid spreads the vectors
// one a thread.
func fp4AmaxBlocks(vecs uint64, sms int) int {
	most := uint64(max(sms, 1) * fp4BlocksPerSM)
	tiles := vecs / fp4AmaxTile
	if tiles == 0 {
		return int(max(1, (vecs+fp4Threads-1)/fp4Threads))
	}
	rounds := (tiles + most - 1) / most
	return int((tiles + rounds - 1) / rounds)
}

// fp4Raws names and shapes an FP4 job's downloaded bytes as the format's Pack does.
func (j gpuJob) fp4Raws(format string, codes, scales, global []byte) []packing.Raw {
	n, k, p := j.n, j.k, j.prefix
	scaleDType := "U8"
	if j.s.Grid == quant.NVFP4 {
		scaleDType = "F8_E4M3"
	}
	names := [3]string{p + ".weight_packed", p + ".weight_scale", p + ".weight_global_scale"}
	var out []packing.Raw
	if format == "qpack" {
		names = [3]string{p + ".qpack_codes", p + ".qpack_scales", p + ".qpack_global_scale"}
		shape := make([]byte, 16)
		binary.LittleEndian.PutUint64(shape, uint64(n))
		binary.LittleEndian.PutUint64(shape[8:], uint64(k))
		out = append(out, packing.Raw{Name: p + ".qpack_shape", DType: "I64", Shape: []int{2}, Data: shape})
	}
	out = append(out,
		packing.Raw{Name: names[0], DType: "U8", Shape: []int{n, k / 2}, Data: codes},
		packing.Raw{Name: names[1], DType: scaleDType, Shape: []int{n, k / j.s.GroupSize}, Data: scales})
	if j.s.Grid == quant.NVFP4 {
		out = append(out, packing.Raw{Name: names[2], DType: "F32", Shape: []int{1}, Data: global})
	}
	return out
}
