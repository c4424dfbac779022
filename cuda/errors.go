package cuda

import (
	"errors"
	"fmt"
)

// ErrNoDriver is wrapped by every error that means the NVIDIA driver library could not be
// loaded; callers fall back to the CPU when errors.Is(err, ErrNoDriver).
var ErrNoDriver = errors.New("NVIDIA driver (libcuda.so.1) not found")

// ErrNoGPU is matched by every error that means the driver loaded but sees no GPU (a container
// or CI machine with NVIDIA's libraries and no device, say); like ErrNoDriver, it sends
// --device auto to the CPU.
var ErrNoGPU = errors.New("no CUDA-capable GPU")

// codeNoDevice is CUDA_ERROR_NO_DEVICE, what cuInit returns when the driver finds no GPU.
const codeNoDevice = 100

// ErrClosed is returned by calls on a Device after Close.
var ErrClosed = errors.New("cuda: device is closed")

// Error is a failed driver call: the function, the CUresult code and the driver's name and
// description of it.
type Error struct {
	Call    string // driver function, e.g. "cuMemAlloc_v2"
	Code    int    // CUresult
	Name    string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Message string // e.g. "out of memory"
}

// Is reports CUDA_ERROR_NO_DEVICE as ErrNoGPU.
func (e *Error) Is(target error) bool {
	return target == ErrNoGPU && e.Code == codeNoDevice
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d: %s)", e.Call, e.Name, e.Code, e.Message)
}

// result is the driver's CUresult.
type result int32

const success result = 0
