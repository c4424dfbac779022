package cuda

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// driverNames are the sonames tried for the driver library, in order.
var driverNames = []string{"libcuda.so.1", "libcuda.so"}

// driver holds the driver API functions bound from libcuda. The versioned names (_v2) are the
// ones cuda.h's macros select; the plain names are legacy 32-bit entry points.
type driver struct {
	lib  uintptr
	name string // soname that loaded

	cuInit                    func(flags uint32) result
	cuDriverGetVersion        func(version *int32) result
	cuGetErrorName            func(code result, name **byte) result
	cuGetErrorString          func(code result, msg **byte) result
	cuDeviceGetCount          func(count *int32) result
	cuDeviceGet               func(dev *int32, ordinal int32) result
	cuDeviceGetName           func(name *byte, size int32, dev int32) result
	cuDeviceTotalMem          func(bytes *uint64, dev int32) result
	cuDeviceGetAttribute      func(value *int32, attr int32, dev int32) result
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) result
	cuDevicePrimaryCtxRelease func(dev int32) result
	cuCtxSetCurrent           func(ctx uintptr) result
	cuCtxSynchronize          func() result
	cuMemGetInfo              func(free, total *uint64) result
	cuMemAlloc                func(ptr *uintptr, bytes uint64) result
	cuMemFree                 func(ptr uintptr) result
	cuMemHostAlloc            func(ptr *unsafe.Pointer, bytes uint64, flags uint32) result
	cuMemFreeHost             func(ptr unsafe.Pointer) result
	cuMemsetD32               func(dst uintptr, value uint32, count uint64) result
	cuMemsetD32Async          func(dst uintptr, value uint32, count uint64, stream uintptr) result
	cuMemcpyHtoD              func(dst uintptr, src unsafe.Pointer, bytes uint64) result
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uintptr, bytes uint64) result
	cuMemcpyDtoD              func(dst, src uintptr, bytes uint64) result
	cuMemcpyHtoDAsync         func(dst uintptr, src unsafe.Pointer, bytes uint64, stream uintptr) result
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uintptr, bytes uint64, stream uintptr) result
	cuMemcpyDtoDAsync         func(dst, src uintptr, bytes uint64, stream uintptr) result
	cuMemcpyPeerAsync         func(dst, dstCtx, src, srcCtx uintptr, bytes uint64, stream uintptr) result
	cuDeviceCanAccessPeer     func(can *int32, dev, peer int32) result
	cuCtxEnablePeerAccess     func(peer uintptr, flags uint32) result
	cuStreamCreate            func(stream *uintptr, flags uint32) result
	cuStreamDestroy           func(stream uintptr) result
	cuStreamSynchronize       func(stream uintptr) result
	cuEventCreate             func(event *uintptr, flags uint32) result
	cuEventDestroy            func(event uintptr) result
	cuEventRecord             func(event, stream uintptr) result
	cuEventSynchronize        func(event uintptr) result
	cuEventElapsedTime        func(ms *float32, start, end uintptr) result
	cuModuleLoadDataEx        func(mod *uintptr, image unsafe.Pointer, nopts uint32, opts *int32, vals *uintptr) result
	cuModuleUnload            func(mod uintptr) result
	cuModuleGetFunction       func(fn *uintptr, mod uintptr, name *byte) result
	cuLaunchKernel            func(fn uintptr, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params, extra unsafe.Pointer) result
}

var (
	driverOnce sync.Once
	theDriver  *driver
	driverErr  error
)

// loadedDriver opens and initializes the driver once per process.
func loadedDriver() (*driver, error) {
	driverOnce.Do(func() {
		markLoaded()
		theDriver, driverErr = loadDriver(driverNames)
		if driverErr == nil {
			driverErr = theDriver.check("cuInit", theDriver.cuInit(0))
			// After UseOnly, no GPU means that one asked for does not exist: not ErrNoGPU (which
			// lets --device auto fall back to the CPU without a word) but an error saying so.
			if note := narrowedNote(); driverErr != nil && note != "" {
				driverErr = fmt.Errorf("%v (%s)", driverErr, strings.TrimPrefix(note, "; "))
			}
		}
	})
	return theDriver, driverErr
}

// loadDriver opens the first of names that loads and binds every function qpack uses.
func loadDriver(names []string) (*driver, error) {
	var failures []string
	for _, name := range names {
		lib, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			failures = append(failures, dlopenFailure(name, err))
			continue
		}
		d := &driver{lib: lib, name: name}
		if err := d.bindAll(); err != nil {
			return nil, err
		}
		return d, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrNoDriver, strings.Join(failures, "; "))
}

// dlopenFailure names the library that failed to open. dlerror's text usually names it, but
// it can come back empty (dlerror is per thread, and the goroutine may have moved between the
// dlopen and the dlerror), so the name is added whenever the text lacks it.
func dlopenFailure(name string, err error) string {
	msg := strings.TrimSpace(err.Error())
	switch {
	case msg == "":
		return name + ": cannot be opened"
	case strings.Contains(msg, name):
		return msg
	default:
		return name + ": " + msg
	}
}

func (d *driver) bindAll() error {
	// Each entry: the field, then symbol names in order of preference.
	bindings := []struct {
		fptr  any
		names []string
	}{
		{&d.cuInit, []string{"cuInit"}},
		{&d.cuDriverGetVersion, []string{"cuDriverGetVersion"}},
		{&d.cuGetErrorName, []string{"cuGetErrorName"}},
		{&d.cuGetErrorString, []string{"cuGetErrorString"}},
		{&d.cuDeviceGetCount, []string{"cuDeviceGetCount"}},
		{&d.cuDeviceGet, []string{"cuDeviceGet"}},
		{&d.cuDeviceGetName, []string{"cuDeviceGetName"}},
		{&d.cuDeviceTotalMem, []string{"cuDeviceTotalMem_v2"}},
		{&d.cuDeviceGetAttribute, []string{"cuDeviceGetAttribute"}},
		{&d.cuDevicePrimaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}},
		{&d.cuDevicePrimaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2"}},
		{&d.cuCtxSetCurrent, []string{"cuCtxSetCurrent"}},
		{&d.cuCtxSynchronize, []string{"cuCtxSynchronize"}},
		{&d.cuMemGetInfo, []string{"cuMemGetInfo_v2"}},
		{&d.cuMemAlloc, []string{"cuMemAlloc_v2"}},
		{&d.cuMemFree, []string{"cuMemFree_v2"}},
		{&d.cuMemHostAlloc, []string{"cuMemHostAlloc"}},
		{&d.cuMemFreeHost, []string{"cuMemFreeHost"}},
		{&d.cuMemsetD32, []string{"cuMemsetD32_v2"}},
		{&d.cuMemsetD32Async, []string{"cuMemsetD32Async"}},
		{&d.cuMemcpyHtoD, []string{"cuMemcpyHtoD_v2"}},
		{&d.cuMemcpyDtoH, []string{"cuMemcpyDtoH_v2"}},
		{&d.cuMemcpyDtoD, []string{"cuMemcpyDtoD_v2"}},
		{&d.cuMemcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2"}},
		{&d.cuMemcpyDtoHAsync, []string{"cuMemcpyDtoHAsync_v2"}},
		{&d.cuMemcpyDtoDAsync, []string{"cuMemcpyDtoDAsync_v2"}},
		{&d.cuMemcpyPeerAsync, []string{"cuMemcpyPeerAsync"}},
		{&d.cuDeviceCanAccessPeer, []string{"cuDeviceCanAccessPeer"}},
		{&d.cuCtxEnablePeerAccess, []string{"cuCtxEnablePeerAccess"}},
		{&d.cuStreamCreate, []string{"cuStreamCreate"}},
		{&d.cuStreamDestroy, []string{"cuStreamDestroy_v2"}},
		{&d.cuStreamSynchronize, []string{"cuStreamSynchronize"}},
		{&d.cuEventCreate, []string{"cuEventCreate"}},
		{&d.cuEventDestroy, []string{"cuEventDestroy_v2"}},
		{&d.cuEventRecord, []string{"cuEventRecord"}},
		{&d.cuEventSynchronize, []string{"cuEventSynchronize"}},
		// CUDA 12.8 added _v2 (and CUDA 13's header selects it); older drivers have only the plain one.
		{&d.cuEventElapsedTime, []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"}},
		{&d.cuModuleLoadDataEx, []string{"cuModuleLoadDataEx"}},
		{&d.cuModuleUnload, []string{"cuModuleUnload"}},
		{&d.cuModuleGetFunction, []string{"cuModuleGetFunction"}},
		{&d.cuLaunchKernel, []string{"cuLaunchKernel"}},
	}
	for _, b := range bindings {
		if err := bindSymbol(d.lib, b.fptr, b.names); err != nil {
			return fmt.Errorf("%s: %w (driver too old?)", d.name, err)
		}
	}
	return nil
}

// bindSymbol binds fptr to the first of names the library exports. It probes with Dlsym
// because purego.RegisterLibFunc panics on a missing symbol.
func bindSymbol(lib uintptr, fptr any, names []string) error {
	for _, name := range names {
		if sym, err := purego.Dlsym(lib, name); err == nil && sym != 0 {
			purego.RegisterFunc(fptr, sym)
			return nil
		}
	}
	return fmt.Errorf("symbol %s not found", strings.Join(names, " or "))
}

// check turns a CUresult into nil or an *Error naming the call.
func (d *driver) check(call string, r result) error {
	if r == success {
		return nil
	}
	e := &Error{Call: call, Code: int(r), Name: "CUDA_ERROR_UNKNOWN_CODE", Message: "no description"}
	var p *byte
	if d.cuGetErrorName(r, &p) == success {
		e.Name = goString(p)
	}
	if d.cuGetErrorString(r, &p) == success {
		e.Message = goString(p)
	}
	return e
}

// goString copies a NUL-terminated C string that the driver owns.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
