package cuda

import (
	"fmt"
	"unsafe"

	"github.com/qpack-dev/qpack/internal/timeline"
)

// DevicePtr is an address in device memory (a CUdeviceptr).
type DevicePtr uintptr

// Add returns p advanced by bytes.
func (p DevicePtr) Add(bytes int) DevicePtr { return p + DevicePtr(bytes) }

// Alloc allocates bytes of device memory (cuMemAlloc: 256-byte aligned, not initialized).
func (d *Device) Alloc(bytes int) (DevicePtr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cuda: Alloc(%d): size must be positive", bytes)
	}
	if bytes >= 64<<20 { // large ones only: their time varies (peer mappings, the driver's locks)
		defer timeline.Begin(d.Info().Ordinal, "alloc %d MB", bytes>>20)()
	}
	var p uintptr
	err := d.do(func() error { return d.drv.check("cuMemAlloc_v2", d.drv.cuMemAlloc(&p, uint64(bytes))) })
	if err != nil {
		return 0, fmt.Errorf("allocating %d bytes on %s: %w", bytes, d.info.Name, err)
	}
	return DevicePtr(p), nil
}

// Free releases memory from Alloc.
func (d *Device) Free(p DevicePtr) error {
	return d.do(func() error { return d.drv.check("cuMemFree_v2", d.drv.cuMemFree(uintptr(p))) })
}

// AllocFor allocates a device buffer for each non-empty slice, rounded up to whole 32-bit words
// (so that Fill32 can zero or poison it), and 0 for an empty one. Free them with FreeAll.
func (d *Device) AllocFor(bufs [][]byte) ([]DevicePtr, error) {
	ptrs := make([]DevicePtr, len(bufs))
	for i, b := range bufs {
		if len(b) == 0 {
			continue
		}
		var err error
		if ptrs[i], err = d.Alloc((len(b) + 3) &^ 3); err != nil {
			d.FreeAll(ptrs)
			return nil, err
		}
	}
	return ptrs, nil
}

// FreeAll frees every non-zero pointer.
func (d *Device) FreeAll(ptrs []DevicePtr) {
	for _, p := range ptrs {
		if p != 0 {
			d.Free(p)
		}
	}
}

// Fill32 sets count 32-bit words at p to value (for poisoning outputs in tests, or zeroing).
func (d *Device) Fill32(p DevicePtr, value uint32, count int) error {
	return d.do(func() error {
		return d.drv.check("cuMemsetD32_v2", d.drv.cuMemsetD32(uintptr(p), value, uint64(count)))
	})
}

// Fill32Async queues setting count 32-bit words at p to value on stream s. Unlike Fill32, it
// neither waits for nor holds up work on other streams.
func (d *Device) Fill32Async(p DevicePtr, value uint32, count int, s Stream) error {
	return d.do(func() error {
		return d.drv.check("cuMemsetD32Async", d.drv.cuMemsetD32Async(uintptr(p), value, uint64(count), uintptr(s)))
	})
}

// AllocHost allocates page-locked host memory that the GPU can copy to and from
// asynchronously. The memory is outside the Go heap; release it with FreeHost.
func (d *Device) AllocHost(bytes int) ([]byte, error) {
	if bytes <= 0 {
		return nil, fmt.Errorf("cuda: AllocHost(%d): size must be positive", bytes)
	}
	var p unsafe.Pointer
	err := d.do(func() error {
		if err := d.drv.check("cuMemHostAlloc", d.drv.cuMemHostAlloc(&p, uint64(bytes), 0)); err != nil {
			return err
		}
		d.pinnedMu.Lock()
		d.pinned[uintptr(p)] = bytes
		d.pinnedMu.Unlock()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes of pinned host memory: %w", bytes, err)
	}
	return unsafe.Slice((*byte)(p), bytes), nil
}

// FreeHost releases memory from AllocHost; buf must be the whole slice AllocHost returned.
func (d *Device) FreeHost(buf []byte) error {
	if len(buf) == 0 {
		return fmt.Errorf("cuda: FreeHost of an empty slice")
	}
	p := unsafe.Pointer(&buf[0])
	d.pinnedMu.Lock()
	_, ok := d.pinned[uintptr(p)]
	delete(d.pinned, uintptr(p))
	d.pinnedMu.Unlock()
	if !ok {
		return fmt.Errorf("cuda: FreeHost: %p is not the start of memory from AllocHost", p)
	}
	return d.do(func() error { return d.drv.check("cuMemFreeHost", d.drv.cuMemFreeHost(p)) })
}

// isPinned reports whether buf lies inside one allocation from AllocHost.
func (d *Device) isPinned(buf []byte) bool {
	d.pinnedMu.Lock()
	defer d.pinnedMu.Unlock()
	start := uintptr(unsafe.Pointer(&buf[0]))
	for base, size := range d.pinned {
		if start >= base && start+uintptr(len(buf)) <= base+uintptr(size) {
			return true
		}
	}
	return false
}

// CopyToDevice copies src to device memory at dst and waits for the copy.
func (d *Device) CopyToDevice(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return d.do(func() error {
		return d.drv.check("cuMemcpyHtoD_v2", d.drv.cuMemcpyHtoD(uintptr(dst), unsafe.Pointer(&src[0]), uint64(len(src))))
	})
}

// CopyFromDevice copies len(dst) bytes from device memory at src into dst and waits for the copy.
func (d *Device) CopyFromDevice(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return d.do(func() error {
		return d.drv.check("cuMemcpyDtoH_v2", d.drv.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), uintptr(src), uint64(len(dst))))
	})
}

// CopyDevice copies bytes between device buffers, ordered after earlier work on the default stream.
func (d *Device) CopyDevice(dst, src DevicePtr, bytes int) error {
	return d.do(func() error {
		return d.drv.check("cuMemcpyDtoD_v2", d.drv.cuMemcpyDtoD(uintptr(dst), uintptr(src), uint64(bytes)))
	})
}

// CopyToDeviceAsync enqueues a copy of src to dst on stream s. src must be memory from
// AllocHost (a Go slice could move or be freed before the copy runs) and must not change until
// the stream reaches this point.
func (d *Device) CopyToDeviceAsync(dst DevicePtr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	return d.do(func() error {
		if !d.isPinned(src) {
			return fmt.Errorf("cuda: CopyToDeviceAsync: source is not pinned memory from AllocHost")
		}
		return d.drv.check("cuMemcpyHtoDAsync_v2",
			d.drv.cuMemcpyHtoDAsync(uintptr(dst), unsafe.Pointer(&src[0]), uint64(len(src)), uintptr(s)))
	})
}

// CopyFromDeviceAsync enqueues a copy from src into dst on stream s; dst must be memory from
// AllocHost and is valid once the stream is synchronized.
func (d *Device) CopyFromDeviceAsync(dst []byte, src DevicePtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return d.do(func() error {
		if !d.isPinned(dst) {
			return fmt.Errorf("cuda: CopyFromDeviceAsync: destination is not pinned memory from AllocHost")
		}
		return d.drv.check("cuMemcpyDtoHAsync_v2",
			d.drv.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), uintptr(src), uint64(len(dst)), uintptr(s)))
	})
}

// CopyDeviceAsync enqueues a device-to-device copy on stream s.
func (d *Device) CopyDeviceAsync(dst, src DevicePtr, bytes int, s Stream) error {
	return d.do(func() error {
		return d.drv.check("cuMemcpyDtoDAsync_v2", d.drv.cuMemcpyDtoDAsync(uintptr(dst), uintptr(src), uint64(bytes), uintptr(s)))
	})
}

// Bytes views a slice of fixed-size numbers as its bytes, for copies (no copy is made).
func Bytes[T ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~int8 | ~int16 | ~int32 | ~int64 | ~float32 | ~float64](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}
