package cuda

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/internal/timeline"
)

// Device attributes read with cuDeviceGetAttribute (values from cuda.h's CUdevice_attribute).
const (
	attrMultiprocessorCount = 16
	attrComputeMajor        = 75
	attrComputeMinor        = 76
)

// DeviceInfo describes one GPU as the driver reports it.
type DeviceInfo struct {
	Ordinal         int
	Name            string
	TotalMemory     uint64 // bytes
	ComputeMajor    int
	ComputeMinor    int
	Multiprocessors int
}

func (i DeviceInfo) String() string {
	return fmt.Sprintf("GPU %d: %s, %.1f GiB, compute capability %d.%d, %d SMs", i.Ordinal, i.Name,
		float64(i.TotalMemory)/(1<<30), i.ComputeMajor, i.ComputeMinor, i.Multiprocessors)
}

// DriverVersion returns the CUDA version the driver supports, e.g. 13000 for 13.0.
func DriverVersion() (int, error) {
	drv, err := loadedDriver()
	if err != nil {
		return 0, err
	}
	var v int32
	if err := drv.check("cuDriverGetVersion", drv.cuDriverGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Devices lists the GPUs the driver sees. It creates no context.
func Devices() ([]DeviceInfo, error) {
	drv, err := loadedDriver()
	if err != nil {
		return nil, err
	}
	var n int32
	if err := drv.check("cuDeviceGetCount", drv.cuDeviceGetCount(&n)); err != nil {
		return nil, err
	}
	infos := make([]DeviceInfo, n)
	for i := range infos {
		if infos[i], err = drv.deviceInfo(i); err != nil {
			return nil, err
		}
	}
	return infos, nil
}

// deviceInfo describes the driver's GPU index (its ordinal: ordinalAt).
func (d *driver) deviceInfo(index int) (DeviceInfo, error) {
	info := DeviceInfo{Ordinal: ordinalAt(index)}
	var dev int32
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, int32(index))); err != nil {
		return info, err
	}
	name := make([]byte, 256)
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return info, err
	}
	info.Name = goString(&name[0])
	if err := d.check("cuDeviceTotalMem_v2", d.cuDeviceTotalMem(&info.TotalMemory, dev)); err != nil {
		return info, err
	}
	for _, a := range []struct {
		attr int32
		dst  *int
	}{
		{attrComputeMajor, &info.ComputeMajor},
		{attrComputeMinor, &info.ComputeMinor},
		{attrMultiprocessorCount, &info.Multiprocessors},
	} {
		var v int32
		if err := d.check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(&v, a.attr, dev)); err != nil {
			return info, err
		}
		*a.dst = int(v)
	}
	return info, nil
}

// Device is one GPU and its retained primary context. Every method runs its driver calls
// through do, which makes the context current on the calling OS thread, so a Device may be used
// from any goroutine. Calls from several goroutines run at once (the driver API is thread-safe):
// one goroutine's long call — creating a cuBLAS handle, pinning host memory, a library's first
// use of a kernel — does not hold up the others' copies and launches on their streams.
type Device struct {
	info DeviceInfo
	drv  *driver
	dev  int32

	mu      sync.RWMutex   // driver calls hold it shared, Close exclusively; guards ctx and reaches
	ctx     uintptr        // 0 once closed
	waiting sync.WaitGroup // blocking waits in progress outside mu (see wait)

	closeOnce sync.Once
	closeErr  error

	pinnedMu sync.Mutex
	pinned   map[uintptr]int // base → size of host memory from AllocHost (under pinnedMu)
	reaches  map[int32]bool  // other GPUs whose memory kernels here may address (EnablePeerAccess)

	convertOnce sync.Once
	convert     *convertKernels
	convertErr  error
}

// Open retains the primary context of GPU ordinal (as the process was given the GPUs: UseOnly
// keeps the ordinals). Without a driver the error wraps ErrNoDriver; with a driver that sees no
// GPU it matches ErrNoGPU.
func Open(ordinal int) (*Device, error) {
	drv, err := loadedDriver()
	if err != nil {
		return nil, err
	}
	var count int32
	if err := drv.check("cuDeviceGetCount", drv.cuDeviceGetCount(&count)); err != nil {
		return nil, err
	}
	if count == 0 {
		return nil, fmt.Errorf("cuda: %w (the driver sees none)", ErrNoGPU)
	}
	index, err := driverIndex(ordinal)
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || index >= int(count) {
		return nil, fmt.Errorf("cuda: no GPU %d (the driver sees %d%s)", ordinal, count, narrowedNote())
	}
	info, err := drv.deviceInfo(index)
	if err != nil {
		return nil, err
	}
	d := &Device{info: info, drv: drv, pinned: map[uintptr]int{}}
	if err := drv.check("cuDeviceGet", drv.cuDeviceGet(&d.dev, int32(index))); err != nil {
		return nil, err
	}
	if err := drv.check("cuDevicePrimaryCtxRetain", drv.cuDevicePrimaryCtxRetain(&d.ctx, d.dev)); err != nil {
		d.ctx = 0
		return nil, err
	}
	return d, nil
}

// do runs f with the device's context current and returns its error. f runs on the calling
// goroutine, locked to its OS thread while the context is made current there (a thread-local
// store in the driver). An earlier version handed f to a dedicated device goroutine instead;
// that hop (two thread wake-ups) cost 10-25 µs per call, more than a kernel launch itself.
// A panic in f becomes an error.
func (d *Device) do(f func() error) (err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.ctx == 0 {
		return ErrClosed
	}
	return d.call(d.ctx, f)
}

// call runs f with context ctx current on the calling goroutine's OS thread; a panic in f
// becomes an error.
func (d *Device) call(ctx uintptr, f func() error) (err error) {
	if timeline.On() {
		defer d.traceSlow(time.Now())
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cuda: panic in a driver call: %v", r)
		}
	}()
	if err := d.drv.check("cuCtxSetCurrent", d.drv.cuCtxSetCurrent(ctx)); err != nil {
		return err
	}
	return f()
}

// slowCall is how long a driver call takes before a timeline shows it (traceSlow).
const slowCall = 2 * time.Millisecond

// traceSlow puts a driver call begun at start on the GPU's timeline lane if it took at least
// slowCall, named by the function of this package that made it ("driver: (*Device).Alloc"): where one of
// the driver's locks holds a call up (an allocation waiting for another thread's module loads,
// say), the trace shows which call waited. Waits for the GPU (Synchronize, SynchronizeStream)
// show too.
func (d *Device) traceSlow(start time.Time) {
	if time.Since(start) < slowCall {
		return
	}
	timeline.Since(d.info.Ordinal, start, "driver: "+callerOfDo())
}

// callerOfDo names the function that called do, wait or call (traceSlow's caller): the method
// without its package path, e.g. "(*BLAS).Sgemm".
func callerOfDo() string {
	pcs := make([]uintptr, 16)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)]) // from traceSlow's caller on
	for {
		fr, more := frames.Next()
		name := fr.Function[strings.LastIndex(fr.Function, "/")+1:]
		name = strings.TrimPrefix(name, "cuda.")
		switch {
		case !more:
			return name
		case name == "(*Device).call", name == "(*Device).do", name == "(*Device).wait",
			strings.HasPrefix(name, "runtime."), strings.Contains(name, ".func"):
		default:
			return name
		}
	}
}

// Info describes the GPU.
func (d *Device) Info() DeviceInfo { return d.info }

// MemoryInfo returns the free and total device memory in bytes.
func (d *Device) MemoryInfo() (free, total uint64, err error) {
	err = d.do(func() error { return d.drv.check("cuMemGetInfo_v2", d.drv.cuMemGetInfo(&free, &total)) })
	return free, total, err
}

// Synchronize waits until all work on the device has finished and reports any error an
// earlier asynchronous launch or copy left behind.
func (d *Device) Synchronize() error {
	return d.do(func() error { return d.drv.check("cuCtxSynchronize", d.drv.cuCtxSynchronize()) })
}

// wait runs a blocking driver call — a stream or event synchronization — with the context
// current but without holding the device lock, so that while one goroutine waits for its
// stream, others can queue copies and kernels on theirs. Close waits for waits in progress.
func (d *Device) wait(f func() error) (err error) {
	d.mu.RLock()
	ctx := d.ctx
	if ctx != 0 {
		d.waiting.Add(1)
	}
	d.mu.RUnlock()
	if ctx == 0 {
		return ErrClosed
	}
	defer d.waiting.Done()
	return d.call(ctx, f)
}

// Close waits for outstanding work and releases the primary context.
// Memory not freed is released with the context when no one else retains it.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock() // no new calls; those under way have returned
		defer d.mu.Unlock()
		d.waiting.Wait() // nor waits: a new one needs mu
		if d.ctx == 0 {
			d.closeErr = ErrClosed
			return
		}
		d.closeErr = d.call(d.ctx, func() error {
			err := d.drv.check("cuCtxSynchronize", d.drv.cuCtxSynchronize())
			if e := d.drv.check("cuDevicePrimaryCtxRelease_v2", d.drv.cuDevicePrimaryCtxRelease(d.dev)); err == nil {
				err = e
			}
			return err
		})
		d.ctx = 0
	})
	return d.closeErr
}
