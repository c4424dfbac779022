package cuda

import (
	"fmt"
	"sync"
)

var (
	mathLibsOnce sync.Once
	mathLibs     []Library
)

// mathLibrary returns cuBLAS or cuSOLVER ("cublas", "cusolver"), loaded once per process.
func mathLibrary(name string) (Library, error) {
	mathLibsOnce.Do(func() { mathLibs = FindLibraries() })
	for _, l := range mathLibs {
		if l.Name == name {
			return l, l.Err
		}
	}
	return Library{}, fmt.Errorf("cuda: unknown math library %q", name)
}

// bindFunctions binds each function pointer to its symbol in lib.
func bindFunctions(lib Library, bindings map[string]any) error {
	for name, fptr := range bindings {
		if err := bindSymbol(lib.Handle, fptr, []string{name}); err != nil {
			return fmt.Errorf("%s (%s): %w", lib.Name, lib.Path, err)
		}
	}
	return nil
}

// Fill says which triangle of a symmetric or triangular matrix is referenced (cublasFillMode_t).
type Fill int32

const (
	Lower Fill = 0
	Upper Fill = 1
)

// DataType is a cudaDataType_t element type for the 64-bit cuSOLVER API.
type DataType int32

const (
	Float32 DataType = 0 // CUDA_R_32F
	Float64 DataType = 1 // CUDA_R_64F
)

func (t DataType) size() int {
	if t == Float64 {
		return 8
	}
	return 4
}
