package cuda

import (
	_ "embed"
	"fmt"
)

//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/convert.cu

var (
	//go:embed kernels/convert.ptx
	convertPTX []byte
	//go:embed kernels/convert.cu
	convertSource []byte
)

// DType is an element type a checkpoint stores and ConvertToF32 reads.
type DType int

const (
	F32 DType = iota
	F16
	BF16
)

func (t DType) String() string {
	switch t {
	case F32:
		return "F32"
	case F16:
		return "F16"
	case BF16:
		return "BF16"
	}
	return fmt.Sprintf("DType(%d)", int(t))
}

// Size is the element size in bytes.
func (t DType) Size() int {
	if t == F32 {
		return 4
	}
	return 2
}

const convertBlock = 256

type convertKernels struct {
	scalar, vec8                 map[DType]Function
	amaxAbs, toF16Scaled         Function
	amaxAbsVec4, toF16ScaledVec8 Function // 16-byte aligned operands
	f16Alpha                     Function
}

func (d *Device) convertKernels() (*convertKernels, error) {
	d.convertOnce.Do(func() {
		m, err := d.LoadModule(convertPTX)
		if err != nil {
			d.convertErr = fmt.Errorf("loading kernels/convert.ptx: %w", err)
			return
		}
		k := &convertKernels{scalar: map[DType]Function{}, vec8: map[DType]Function{}}
		for t, name := range map[DType]string{F16: "f16_to_f32", BF16: "bf16_to_f32"} {
			if k.scalar[t], err = m.Function(name); err == nil {
				k.vec8[t], err = m.Function(name + "_vec8")
			}
			if err != nil {
				d.convertErr = err
				return
			}
		}
		for _, f := range []struct {
			dst  *Function
			name string
		}{{&k.amaxAbs, "amax_abs"}, {&k.toF16Scaled, "to_f16_scaled"}, {&k.amaxAbsVec4, "amax_abs_vec4"}, {&k.toF16ScaledVec8, "to_f16_scaled_vec8"},
			{&k.f16Alpha, "f16_alpha"}} {
			if *f.dst, err = m.Function(f.name); err != nil {
				d.convertErr = err
				return
			}
		}
		d.convert = k
	})
	return d.convert, d.convertErr
}

// ConvertToF32 enqueues on stream s the widening of n elements of type t at src into float32
// at dst (exact for F16 and BF16; F32 is a device copy). dst must not overlap src.
func (d *Device) ConvertToF32(dst, src DevicePtr, t DType, n int, s Stream) error {
	return d.ConvertToF32Checked(dst, src, t, n, 0, 0, s)
}

// ConvertToF32Checked is ConvertToF32 that also lowers the device word *first (uint64) to base + i
// for each element i of an F16 or BF16 src that is a NaN or an infinity (atomicMin): start it at
// the largest uint64, and after the stream's work it holds the first non-finite element's index
// plus base, or the largest uint64. first 0 checks nothing; an F32 src is not checked.
func (d *Device) ConvertToF32Checked(dst, src DevicePtr, t DType, n int, first DevicePtr, base uint64, s Stream) error {
	if n <= 0 {
		return fmt.Errorf("cuda: ConvertToF32 of %d elements", n)
	}
	if t == F32 {
		return d.CopyDeviceAsync(dst, src, 4*n, s)
	}
	if t != F16 && t != BF16 {
		return fmt.Errorf("cuda: ConvertToF32: unsupported type %s", t)
	}
	k, err := d.convertKernels()
	if err != nil {
		return err
	}
	fn, work := k.scalar[t], n
	if src%16 == 0 && dst%16 == 0 {
		fn, work = k.vec8[t], max(n/8, n%8)
	}
	// Grid-stride loops: enough blocks to fill the GPU several times over, no more.
	blocks := min((work+convertBlock-1)/convertBlock, 32*max(d.info.Multiprocessors, 1))
	return fn.Launch(Dim3{blocks, 1, 1}, Dim3{convertBlock, 1, 1}, 0, s, src, dst, uint64(n), first, base)
}

// ToF16Scaled enqueues on stream s dst[:n] = src[:n]·2^sh rounded to FP16 (to nearest even), sh
// the power of two that puts src's largest magnitude in [2^14, 2^15), FP16's top binades (±60 at
// most; 0 when every value is zero), found on the GPU: FP16's 11-bit significand, TF32's, over
// any range. NaNs are left out of the largest magnitude; infinities and NaNs stay what they are.
// amax is a device word, the largest magnitude's scratch. The kernel writes sh to shift and, for a
// GEMM of dst with an operand scaled by 2^t, the alpha 2^−(sh+t) that undoes both scales exactly
// to alpha, t = *other, or sh when other is 0 (a Gram matrix dstᵀdst); shift and alpha may be 0,
// and other may be shift. The host never waits for sh: a GEMM reads alpha from device memory.
func (d *Device) ToF16Scaled(dst, src DevicePtr, n int, amax, other, shift, alpha DevicePtr, s Stream) error {
	if n <= 0 {
		return fmt.Errorf("cuda: ToF16Scaled of %d elements", n)
	}
	k, err := d.convertKernels()
	if err != nil {
		return err
	}
	if err := d.Fill32Async(amax, 0, 1, s); err != nil {
		return err
	}
	const threads, maxBlocks = 256, 1024
	scan, scale := k.amaxAbs, k.toF16Scaled
	scanBlocks := max(1, min(maxBlocks, (n+threads-1)/threads))
	scaleBlocks := (n + threads - 1) / threads // one element per thread
	if src%16 == 0 && dst%16 == 0 {            // whole vectors
		scan, scale = k.amaxAbsVec4, k.toF16ScaledVec8
		scanBlocks = max(1, min(maxBlocks, (n/4+threads-1)/threads))
		scaleBlocks = max(1, min((max(n/8, n%8)+threads-1)/threads, 32*max(d.info.Multiprocessors, 1))) // grid-stride
	}
	if err := scan.Launch(Dim3{scanBlocks, 1, 1}, Dim3{threads, 1, 1}, 0, s, src, int64(n), amax); err != nil {
		return err
	}
	return scale.Launch(Dim3{scaleBlocks, 1, 1}, Dim3{threads, 1, 1}, 0, s, src, dst, int64(n), amax, other, shift, alpha)
}

// F16Alpha enqueues on stream s the alpha that ToF16Scaled writes, 2^−(sh+t), for an operand it
// scaled by 2^sh (sh = *shift, as it wrote it) and a GEMM with another scaled by 2^t (t = *other,
// or sh when other is 0): an input converted once, then read by GEMMs with several operands.
func (d *Device) F16Alpha(shift, other, alpha DevicePtr, s Stream) error {
	k, err := d.convertKernels()
	if err != nil {
		return err
	}
	return k.f16Alpha.Launch(Dim3{1, 1, 1}, Dim3{1, 1, 1}, 0, s, shift, other, alpha)
}
