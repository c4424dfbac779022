package blas

import (
	"errors"
	"fmt"
	"os"
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

// library is the opened BLAS and the functions bound from it.
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

// lib opens the library on first use.
func lib() (*library, error) {
	loadOnce.Do(func() {
		if os.Getenv("QPACK_BLAS") == "go" {
			loadErr = errors.New("blas: QPACK_BLAS=go forces the pure-Go path")
			return
		}
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
	return nil, fmt.Errorf("blas: OpenBLAS not found (%s)", strings.Join(failures, "; "))
}

// Available reports whether OpenBLAS is loaded, and the name it was loaded by.
func Available() (path string, ok bool) {
	l, err := lib()
	if err != nil {
		return "", false
	}
	return l.path, true
}

// LoadErr says why OpenBLAS is not available (every name tried and why it failed, or
// QPACK_BLAS=go); nil when it is.
func LoadErr() error {
	_, err := lib()
	return err
}
