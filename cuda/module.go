package cuda

import (
	"bytes"
	"fmt"
	"math"
	"runtime"
	"unsafe"
)

// JIT options of cuModuleLoadDataEx (CUjit_option in cuda.h).
const (
	jitErrorLogBuffer          = 5
	jitErrorLogBufferSizeBytes = 6
)

// Module is loaded device code (a CUmodule).
type Module struct {
	d *Device
	h uintptr
}

// Function is a kernel of a loaded module (a CUfunction).
type Function struct {
	d    *Device
	h    uintptr
	name string
}

// Dim3 is a grid or block size.
type Dim3 struct{ X, Y, Z int }

// LoadModule JIT-compiles PTX text for this GPU. A compile failure returns the JIT's log.
func (d *Device) LoadModule(ptx []byte) (*Module, error) {
	image := ptx
	if !bytes.HasSuffix(image, []byte{0}) {
		image = append(append(make([]byte, 0, len(ptx)+1), ptx...), 0)
	}
	return d.loadImage(image)
}

// loadImage loads PTX text (NUL-terminated) or a cubin.
func (d *Device) loadImage(image []byte) (*Module, error) {
	log := make([]byte, 8192)
	m := &Module{d: d}
	err := d.do(func() error {
		var pin runtime.Pinner
		defer pin.Unpin()
		pin.Pin(&log[0])
		opts := []int32{jitErrorLogBufferSizeBytes, jitErrorLogBuffer}
		vals := []uintptr{uintptr(len(log)), uintptr(unsafe.Pointer(&log[0]))}
		r := d.drv.cuModuleLoadDataEx(&m.h, unsafe.Pointer(&image[0]), uint32(len(opts)), &opts[0], &vals[0])
		return d.drv.check("cuModuleLoadDataEx", r)
	})
	if err != nil {
		if msg := goString(&log[0]); msg != "" {
			return nil, fmt.Errorf("%w: JIT log: %s", err, msg)
		}
		return nil, err
	}
	return m, nil
}

// Function looks up a kernel by its (extern "C") name.
func (m *Module) Function(name string) (Function, error) {
	f := Function{d: m.d, name: name}
	cname := append([]byte(name), 0)
	err := m.d.do(func() error {
		return m.d.drv.check("cuModuleGetFunction", m.d.drv.cuModuleGetFunction(&f.h, m.h, &cname[0]))
	})
	if err != nil {
		return Function{}, fmt.Errorf("kernel %q: %w", name, err)
	}
	return f, nil
}

// Unload releases the module; its functions become invalid.
func (m *Module) Unload() error {
	return m.d.do(func() error { return m.d.drv.check("cuModuleUnload", m.d.drv.cuModuleUnload(m.h)) })
}

// Launch enqueues kernel f on stream s. Each argument must match the kernel's parameter:
// DevicePtr for pointers, and int32, uint32, int64, uint64, float32 or float64 for scalars
// (a Go int is passed as a 64-bit integer). Launch returns launch errors; errors during the
// kernel's run appear at the next synchronization.
func (f Function) Launch(grid, block Dim3, sharedBytes int, s Stream, args ...any) error {
	params, err := kernelParams(args)
	if err != nil {
		return fmt.Errorf("kernel %s: %w", f.name, err)
	}
	dims := []int{grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z, sharedBytes}
	for i, v := range dims {
		if v < 0 || v > math.MaxUint32 || (i < 6 && v == 0) {
			return fmt.Errorf("kernel %s: bad launch size grid %v block %v shared %d", f.name, grid, block, sharedBytes)
		}
	}
	return f.d.do(func() error {
		// The driver reads each argument through a pointer during cuLaunchKernel; the values and
		// the pointer array are Go memory, pinned so that handing them to C is allowed.
		var pin runtime.Pinner
		defer pin.Unpin()
		var argv unsafe.Pointer
		if len(params) > 0 {
			pin.Pin(&params[0])
			ptrs := make([]unsafe.Pointer, len(params))
			for i := range params {
				ptrs[i] = unsafe.Pointer(&params[i])
			}
			pin.Pin(&ptrs[0])
			argv = unsafe.Pointer(&ptrs[0])
		}
		r := f.d.drv.cuLaunchKernel(f.h, uint32(grid.X), uint32(grid.Y), uint32(grid.Z),
			uint32(block.X), uint32(block.Y), uint32(block.Z), uint32(sharedBytes), uintptr(s), argv, nil)
		if err := f.d.drv.check("cuLaunchKernel", r); err != nil {
			return fmt.Errorf("kernel %s: %w", f.name, err)
		}
		return nil
	})
}

// kernelParams stores each argument in its own 8-byte slot, little-endian, so that a pointer
// to the slot is a pointer to a value of the argument's C type.
func kernelParams(args []any) ([]uint64, error) {
	params := make([]uint64, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case DevicePtr:
			params[i] = uint64(v)
		case int32:
			params[i] = uint64(uint32(v))
		case uint32:
			params[i] = uint64(v)
		case int64:
			params[i] = uint64(v)
		case int:
			params[i] = uint64(v)
		case uint64:
			params[i] = v
		case float32:
			params[i] = uint64(math.Float32bits(v))
		case float64:
			params[i] = math.Float64bits(v)
		default:
			return nil, fmt.Errorf("argument %d has unsupported type %T", i, a)
		}
	}
	return params, nil
}
