package cuda

import (
	"time"
)

// Stream is a queue of device work (a CUstream). The zero Stream is the default stream.
type Stream uintptr

// Event marks a point in a stream (a CUevent), used for timing and ordering.
type Event uintptr

// NewStream creates a stream.
func (d *Device) NewStream() (Stream, error) {
	var s uintptr
	err := d.do(func() error { return d.drv.check("cuStreamCreate", d.drv.cuStreamCreate(&s, 0)) })
	return Stream(s), err
}

// DestroyStream releases s after its queued work completes.
func (d *Device) DestroyStream(s Stream) error {
	return d.do(func() error { return d.drv.check("cuStreamDestroy_v2", d.drv.cuStreamDestroy(uintptr(s))) })
}

// SynchronizeStream waits for the work queued on s.
func (d *Device) SynchronizeStream(s Stream) error {
	return d.wait(func() error { return d.drv.check("cuStreamSynchronize", d.drv.cuStreamSynchronize(uintptr(s))) })
}

// NewEvent creates an event that records timing.
func (d *Device) NewEvent() (Event, error) {
	var e uintptr
	err := d.do(func() error { return d.drv.check("cuEventCreate", d.drv.cuEventCreate(&e, 0)) })
	return Event(e), err
}

// DestroyEvent releases e.
func (d *Device) DestroyEvent(e Event) error {
	return d.do(func() error { return d.drv.check("cuEventDestroy_v2", d.drv.cuEventDestroy(uintptr(e))) })
}

// Record enqueues e on stream s.
func (d *Device) Record(e Event, s Stream) error {
	return d.do(func() error { return d.drv.check("cuEventRecord", d.drv.cuEventRecord(uintptr(e), uintptr(s))) })
}

// SynchronizeEvent waits until the work queued before e's Record has finished.
func (d *Device) SynchronizeEvent(e Event) error {
	return d.wait(func() error { return d.drv.check("cuEventSynchronize", d.drv.cuEventSynchronize(uintptr(e))) })
}

// Elapsed waits for end and returns the device time between two recorded events
// (resolution about half a microsecond).
func (d *Device) Elapsed(start, end Event) (time.Duration, error) {
	var ms float32
	if err := d.SynchronizeEvent(end); err != nil {
		return 0, err
	}
	err := d.do(func() error {
		return d.drv.check("cuEventElapsedTime", d.drv.cuEventElapsedTime(&ms, uintptr(start), uintptr(end)))
	})
	return time.Duration(float64(ms) * float64(time.Millisecond)), err
}
