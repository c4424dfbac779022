package blas

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// libraryNames are the sonames and paths tried after $QPACK_OPENBLAS, in order.
var libraryNames = []string{
	"libopenblas.so.0",
	"libopenblas.so",
	"/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
	"libblas.so.3", // accepted only when it is OpenBLAS behind Debian's alternatives
}

// CBLAS enumerations (cblas.h).
const (
	rowMajor int32 = 101
	noTrans  int32 = 111
	trans    int32 = 112
)

// library is the opened OpenBLAS and the functions bound from it.
type library struct {
	path string
	// cblas_sgemm computes C = alpha·op(A)·op(B) + beta·C; blasint is int32 in every
	// libopenblas.so.0 (the 64-bit-index build is libopenblas64).
	sgemm func(order, transA, transB, m, n, k int32, alpha float32, a *float32, lda int32,
		b *float32, ldb int32, beta float32, c *float32, ldc int32)
}

var (
	loadOnce sync.Once
	loaded   *library
	loadErr  error
)

// openBLAS opens the library on first use: $QPACK_OPENBLAS first when set, then the usual names.
func openBLAS() (*library, error) {
	loadOnce.Do(func() {
		names := libraryNames
		if p := os.Getenv("QPACK_OPENBLAS"); p != "" {
			names = append([]string{p}, names...)
		}
		loaded, loadErr = open(names)
	})
	return loaded, loadErr
}

// open returns the first of names that loads and exports cblas_sgemm.
func open(names []string) (*library, error) {
	var failures []string
	for _, name := range names {
		handle, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			failures = append(failures, err.Error())
			continue
		}
		sym, err := purego.Dlsym(handle, "cblas_sgemm")
		if err != nil {
			failures = append(failures, fmt.Sprintf("%s: no cblas_sgemm", name))
			purego.Dlclose(handle)
			continue
		}
		l := &library{path: name}
		purego.RegisterFunc(&l.sgemm, sym)
		return l, nil
	}
	return nil, fmt.Errorf("OpenBLAS not found (%s)", strings.Join(failures, "; "))
}

// gemm is Sgemm through cblas_sgemm; the arguments are checked and m, n, k > 0.
func (l *library) gemm(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	l.sgemm(rowMajor, cblasTranspose(tA), cblasTranspose(tB), int32(m), int32(n), int32(k), alpha, &a[0], int32(lda),
		&b[0], int32(ldb), beta, &c[0], int32(ldc))
	// The call holds only uintptrs; the slices must outlive it.
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
	runtime.KeepAlive(c)
}

func cblasTranspose(t Transpose) int32 {
	if t == Trans {
		return trans
	}
	return noTrans
}
