package cuda

import (
	"fmt"

	"github.com/qpack-dev/qpack/internal/timeline"
)

// Transpose says whether a cuBLAS operand is used as stored or transposed (cublasOperation_t).
type Transpose int32

const (
	NoTrans Transpose = 0
	Trans   Transpose = 1
)

// BLAS is a cuBLAS handle bound to one device. Matrices are column-major, as in cuBLAS; a
// row-major m×n matrix is the column-major n×m matrix of its transpose. Calls are enqueued on
// the handle's stream (SetStream; the default stream until then). Not safe for concurrent use.
type BLAS struct {
	d *Device
	h uintptr

	create    func(h *uintptr) int32
	destroy   func(h uintptr) int32
	setStream func(h, s uintptr) int32
	sgemm     func(h uintptr, ta, tb, m, n, k int32, alpha *float32, a uintptr, lda int32, b uintptr, ldb int32, beta *float32, c uintptr, ldc int32) int32
	dgemm     func(h uintptr, ta, tb, m, n, k int32, alpha *float64, a uintptr, lda int32, b uintptr, ldb int32, beta *float64, c uintptr, ldc int32) int32
	dtrsm     func(h uintptr, side, uplo, trans, diag, m, n int32, alpha *float64, a uintptr, lda int32, b uintptr, ldb int32) int32
	dsyrk     func(h uintptr, uplo, trans, n, k int32, alpha *float64, a uintptr, lda int32, beta *float64, c uintptr, ldc int32) int32
	sgemmSB   func(h uintptr, ta, tb, m, n, k int32, alpha *float32, a uintptr, lda int32, sa int64, b uintptr, ldb int32, sb int64, beta *float32, c uintptr, ldc int32, sc int64, batch int32) int32
	mathMode  func(h uintptr, mode int32) int32
	gemmEx    func(h uintptr, ta, tb, m, n, k int32, alpha *float32, a uintptr, at, lda int32, b uintptr, bt, ldb int32, beta *float32, c uintptr, ct, ldc, compute, algo int32) int32
	dscal     func(h uintptr, n int32, alpha *float64, x uintptr, incx int32) int32
	// cublasGemmEx again, with alpha and beta as device addresses (GemmF16), and the pointer mode
	// that makes cuBLAS read them there.
	gemmExDev   func(h uintptr, ta, tb, m, n, k int32, alpha uintptr, a uintptr, at, lda int32, b uintptr, bt, ldb int32, beta uintptr, c uintptr, ct, ldc, compute, algo int32) int32
	pointerMode func(h uintptr, mode int32) int32
	dcopy       func(h uintptr, n int32, x uintptr, incx int32, y uintptr, incy int32) int32
}

// NewBLAS loads cuBLAS (see FindLibraries) and creates a handle on d.
func (d *Device) NewBLAS() (*BLAS, error) {
	defer timeline.Begin(d.Info().Ordinal, "cuBLAS handle")()
	lib, err := mathLibrary("cublas")
	if err != nil {
		return nil, err
	}
	b := &BLAS{d: d}
	if err := bindFunctions(lib, map[string]any{
		"cublasCreate_v2": &b.create, "cublasDestroy_v2": &b.destroy, "cublasSetStream_v2": &b.setStream,
		"cublasSgemm_v2": &b.sgemm, "cublasDgemm_v2": &b.dgemm, "cublasDtrsm_v2": &b.dtrsm, "cublasDsyrk_v2": &b.dsyrk,
		"cublasSgemmStridedBatched": &b.sgemmSB, "cublasSetMathMode": &b.mathMode,
		"cublasGemmEx":   &b.gemmEx,
		"cublasDscal_v2": &b.dscal, "cublasDcopy_v2": &b.dcopy,
	}); err != nil {
		return nil, err
	}
	if err := bindFunctions(lib, map[string]any{"cublasGemmEx": &b.gemmExDev, "cublasSetPointerMode_v2": &b.pointerMode}); err != nil {
		return nil, err
	}
	if err := d.do(func() error { return blasCheck("cublasCreate", b.create(&b.h)) }); err != nil {
		return nil, err
	}
	return b, nil
}

// blasCheck turns a cublasStatus_t into an error naming the call.
func blasCheck(call string, status int32) error {
	if status == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s failed with cuBLAS status %d", call, status)
}

// SetStream makes later calls run on stream s.
func (b *BLAS) SetStream(s Stream) error {
	return b.d.do(func() error { return blasCheck("cublasSetStream", b.setStream(b.h, uintptr(s))) })
}

// cublasMath_t values.
const (
	mathDefault = 0
	mathTF32    = 3 // CUBLAS_TF32_TENSOR_OP_MATH
)

// SetTF32 lets later float32 GEMMs round their inputs to TF32 (10-bit mantissa) and use the
// tensor cores — several times faster, with a relative error near 3e-4 instead of 1e-6 — or,
// with on false, restores cuBLAS's default true-float32 math.
func (b *BLAS) SetTF32(on bool) error {
	mode := int32(mathDefault)
	if on {
		mode = mathTF32
	}
	return b.d.do(func() error { return blasCheck("cublasSetMathMode", b.mathMode(b.h, mode)) })
}

// Close destroys the handle.
func (b *BLAS) Close() error {
	return b.d.do(func() error { return blasCheck("cublasDestroy", b.destroy(b.h)) })
}

// gemmArgs checks the sizes of C[m×n] = alpha·op(A)·op(B) + beta·C for 32-bit cuBLAS ints.
func gemmArgs(m, n, k, lda, ldb, ldc int) error {
	for _, v := range []int{m, n, k, lda, ldb, ldc} {
		if v < 0 || v > 1<<31-1 {
			return fmt.Errorf("cuda: gemm size %d out of range (m=%d n=%d k=%d lda=%d ldb=%d ldc=%d)", v, m, n, k, lda, ldb, ldc)
		}
	}
	return nil
}

// Sgemm enqueues C = alpha·op(A)·op(B) + beta·C in float32 (column-major; C is m×n, op(A) m×k,
// op(B) k×n), with cuBLAS's default math (true float32) unless SetTF32 said otherwise.
func (b *BLAS) Sgemm(ta, tb Transpose, m, n, k int, alpha float32, a DevicePtr, lda int, bm DevicePtr, ldb int, beta float32, c DevicePtr, ldc int) error {
	if err := gemmArgs(m, n, k, lda, ldb, ldc); err != nil {
		return err
	}
	return b.d.do(func() error {
		return blasCheck("cublasSgemm", b.sgemm(b.h, int32(ta), int32(tb), int32(m), int32(n), int32(k),
			&alpha, uintptr(a), int32(lda), uintptr(bm), int32(ldb), &beta, uintptr(c), int32(ldc)))
	})
}

// SgemmStridedBatched enqueues batch independent Sgemm products; the i-th uses A + i·strideA,
// B + i·strideB and C + i·strideC (strides in elements).
func (b *BLAS) SgemmStridedBatched(ta, tb Transpose, m, n, k int, alpha float32, a DevicePtr, lda, strideA int, bm DevicePtr, ldb, strideB int, beta float32, c DevicePtr, ldc, strideC, batch int) error {
	if err := gemmArgs(m, n, k, lda, ldb, ldc); err != nil {
		return err
	}
	if batch < 0 || batch > 1<<31-1 || strideA < 0 || strideB < 0 || strideC < 0 {
		return fmt.Errorf("cuda: batched gemm: batch %d, strides %d %d %d", batch, strideA, strideB, strideC)
	}
	return b.d.do(func() error {
		return blasCheck("cublasSgemmStridedBatched", b.sgemmSB(b.h, int32(ta), int32(tb), int32(m), int32(n), int32(k),
			&alpha, uintptr(a), int32(lda), int64(strideA), uintptr(bm), int32(ldb), int64(strideB), &beta,
			uintptr(c), int32(ldc), int64(strideC), int32(batch)))
	})
}

// cuBLAS enumerations of GemmBF16: cudaDataType_t CUDA_R_16BF and CUDA_R_32F,
// cublasComputeType_t CUBLAS_COMPUTE_32F, cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT.
const (
	dataR16BF       = 14
	dataR32F        = 0
	compute32F      = 68
	gemmDefaultAlgo = -1
)

// GemmBF16 enqueues C = alpha·op(A)·op(B) + beta·C with A and B in bfloat16 and C in float32,
// products accumulated in float32 on the tensor cores at their BF16 rate (about twice TF32's).
func (b *BLAS) GemmBF16(ta, tb Transpose, m, n, k int, alpha float32, a DevicePtr, lda int, bm DevicePtr, ldb int, beta float32, c DevicePtr, ldc int) error {
	if err := gemmArgs(m, n, k, lda, ldb, ldc); err != nil {
		return err
	}
	return b.d.do(func() error {
		return blasCheck("cublasGemmEx", b.gemmEx(b.h, int32(ta), int32(tb), int32(m), int32(n), int32(k),
			&alpha, uintptr(a), dataR16BF, int32(lda), uintptr(bm), dataR16BF, int32(ldb), &beta, uintptr(c), dataR32F,
			int32(ldc), compute32F, gemmDefaultAlgo))
	})
}

// CUDA_R_16F and cublasPointerMode_t's values.
const (
	dataR16F          = 2
	pointerModeHost   = 0
	pointerModeDevice = 1
)

// GemmF16 enqueues C = alpha·op(A)·op(B) + beta·C with A and B in FP16 and C in float32,
// products accumulated in float32 at the tensor cores' FP16 rate (BF16's). alpha and beta are
// float32s in device memory, read when the GEMM runs: a kernel queued before it on the stream
// may compute them (the scales of operands scaled by powers of two to fit FP16's range).
func (b *BLAS) GemmF16(ta, tb Transpose, m, n, k int, alpha, a DevicePtr, lda int, bm DevicePtr, ldb int, beta, c DevicePtr, ldc int) error {
	if err := gemmArgs(m, n, k, lda, ldb, ldc); err != nil {
		return err
	}
	return b.d.do(func() error {
		if err := blasCheck("cublasSetPointerMode", b.pointerMode(b.h, pointerModeDevice)); err != nil {
			return err
		}
		err := blasCheck("cublasGemmEx", b.gemmExDev(b.h, int32(ta), int32(tb), int32(m), int32(n), int32(k),
			uintptr(alpha), uintptr(a), dataR16F, int32(lda), uintptr(bm), dataR16F, int32(ldb), uintptr(beta), uintptr(c), dataR32F,
			int32(ldc), compute32F, gemmDefaultAlgo))
		if e := blasCheck("cublasSetPointerMode", b.pointerMode(b.h, pointerModeHost)); err == nil {
			err = e
		}
		return err
	})
}

// Dgemm is Sgemm in float64.
func (b *BLAS) Dgemm(ta, tb Transpose, m, n, k int, alpha float64, a DevicePtr, lda int, bm DevicePtr, ldb int, beta float64, c DevicePtr, ldc int) error {
	if err := gemmArgs(m, n, k, lda, ldb, ldc); err != nil {
		return err
	}
	return b.d.do(func() error {
		return blasCheck("cublasDgemm", b.dgemm(b.h, int32(ta), int32(tb), int32(m), int32(n), int32(k),
			&alpha, uintptr(a), int32(lda), uintptr(bm), int32(ldb), &beta, uintptr(c), int32(ldc)))
	})
}

// sideRight is CUBLAS_SIDE_RIGHT: the triangular matrix multiplies from the right.
const sideRight = 1

// DtrsmRightLowerTrans enqueues B = alpha·B·L⁻ᵀ for the m×n matrix B and the n×n lower
// triangular L (non-unit diagonal): with L the Cholesky factor of a matrix's top-left block,
// the factor's rows below it, from the matrix's.
func (b *BLAS) DtrsmRightLowerTrans(m, n int, alpha float64, l DevicePtr, ldl int, bm DevicePtr, ldb int) error {
	if err := gemmArgs(m, n, n, ldl, ldb, ldb); err != nil {
		return err
	}
	return b.d.do(func() error {
		return blasCheck("cublasDtrsm", b.dtrsm(b.h, sideRight, int32(Lower), int32(Trans), 0, int32(m), int32(n),
			&alpha, uintptr(l), int32(ldl), uintptr(bm), int32(ldb)))
	})
}

// DsyrkLower enqueues C = alpha·A·Aᵀ + beta·C on the lower triangle of the n×n matrix C, for
// the n×k matrix A.
func (b *BLAS) DsyrkLower(n, k int, alpha float64, a DevicePtr, lda int, beta float64, c DevicePtr, ldc int) error {
	if err := gemmArgs(n, n, k, lda, lda, ldc); err != nil {
		return err
	}
	return b.d.do(func() error {
		return blasCheck("cublasDsyrk", b.dsyrk(b.h, int32(Lower), int32(NoTrans), int32(n), int32(k),
			&alpha, uintptr(a), int32(lda), &beta, uintptr(c), int32(ldc)))
	})
}

// vectorArgs checks a vector operation's sizes for 32-bit cuBLAS ints.
func vectorArgs(n int, incs ...int) error {
	for _, v := range append([]int{n}, incs...) {
		if v < 0 || v > 1<<31-1 {
			return fmt.Errorf("cuda: vector size or stride %d out of range (n=%d, strides %v)", v, n, incs)
		}
	}
	return nil
}

// Dscal enqueues x = alpha·x for n float64s spaced incx apart.
func (b *BLAS) Dscal(n int, alpha float64, x DevicePtr, incx int) error {
	if err := vectorArgs(n, incx); err != nil {
		return err
	}
	return b.d.do(func() error { return blasCheck("cublasDscal", b.dscal(b.h, int32(n), &alpha, uintptr(x), int32(incx))) })
}

// Dcopy enqueues y[i·incy] = x[i·incx] for n float64s (incx = ld+1 reads a diagonal).
func (b *BLAS) Dcopy(n int, x DevicePtr, incx int, y DevicePtr, incy int) error {
	if err := vectorArgs(n, incx, incy); err != nil {
		return err
	}
	return b.d.do(func() error {
		return blasCheck("cublasDcopy", b.dcopy(b.h, int32(n), uintptr(x), int32(incx), uintptr(y), int32(incy)))
	})
}
