package cuda

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// The pieces of a GPU worker with slots (blockwise.GPUQuantizer, kquant.GPUFitter): each call
// takes a slot with its own stream and its own device and pinned buffers, so that concurrent
// calls overlap one tensor's staging and upload with another's kernels and download. The
// buffers grow to the largest tensor seen and are kept.

// DeviceBuffer is device memory that grows to the largest size asked of it.
type DeviceBuffer struct {
	Ptr  DevicePtr
	Size int
}

// Grow makes b hold at least size bytes (rounded up to whole words, so that Fill32 reaches
// every byte), replacing its memory when it is smaller; its contents are then lost. A size of
// 0 leaves b as it is.
func (d *Device) Grow(b *DeviceBuffer, size int) error {
	if size <= b.Size {
		return nil
	}
	if b.Size > 0 {
		if err := d.Free(b.Ptr); err != nil {
			return err
		}
		*b = DeviceBuffer{}
	}
	size = (size + 3) / 4 * 4
	p, err := d.Alloc(size)
	if err != nil {
		return err
	}
	*b = DeviceBuffer{Ptr: p, Size: size}
	return nil
}

// Release frees b's memory, if any.
func (d *Device) Release(b *DeviceBuffer) error {
	if b.Size == 0 {
		return nil
	}
	err := d.Free(b.Ptr)
	*b = DeviceBuffer{}
	return err
}

// GrowHost makes *buf pinned memory of at least size bytes, growing by half again (and to at
// least 1 MiB) so that a run of growing tensors reallocates rarely; its contents are then lost.
func (d *Device) GrowHost(buf *[]byte, size int) error {
	if len(*buf) >= size {
		return nil
	}
	size = max(size, len(*buf)*3/2, 1<<20)
	if *buf != nil {
		if err := d.FreeHost(*buf); err != nil {
			return err
		}
		*buf = nil
	}
	b, err := d.AllocHost(size)
	if err != nil {
		return fmt.Errorf("%w (pinned memory for one tensor on the GPU; fewer GPU slots need less)", err)
	}
	*buf = b
	return nil
}

// SlotStats says where a slotted worker's calls spent their time, summed over every call.
// Host phases are timed with the host clock, device phases with CUDA events on the call's
// stream. Calls on different slots overlap, so the sums can exceed the wall time; a device
// phase also counts the time its stream waited for another slot's work on the same engine.
type SlotStats struct {
	Calls    int
	InBytes  int64         // raw input bytes staged and uploaded
	OutBytes int64         // bytes of the results handed back
	Wait     time.Duration // waiting for a free slot
	Staging  time.Duration // filling the pinned input buffer: the input is read here
	Upload   time.Duration // host to device
	Kernels  time.Duration
	Download time.Duration // device to host
	Use      time.Duration // host: the caller's use of the results in pinned memory
}

// CallTimes are the phases of one call.
type CallTimes struct {
	Wait, Staging, Upload, Kernels, Download, Use time.Duration
}

// Plus returns the sums of s's and o's fields.
func (s SlotStats) Plus(o SlotStats) SlotStats {
	return SlotStats{Calls: s.Calls + o.Calls, InBytes: s.InBytes + o.InBytes, OutBytes: s.OutBytes + o.OutBytes,
		Wait: s.Wait + o.Wait, Staging: s.Staging + o.Staging, Upload: s.Upload + o.Upload, Kernels: s.Kernels + o.Kernels,
		Download: s.Download + o.Download, Use: s.Use + o.Use}
}

// StatsRecorder accumulates SlotStats from concurrent calls.
type StatsRecorder struct {
	mu    sync.Mutex
	stats SlotStats
}

// Record adds one finished call with its input and output bytes.
func (r *StatsRecorder) Record(t CallTimes, inBytes, outBytes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats = r.stats.Plus(SlotStats{Calls: 1, InBytes: int64(inBytes), OutBytes: int64(outBytes), Wait: t.Wait,
		Staging: t.Staging, Upload: t.Upload, Kernels: t.Kernels, Download: t.Download, Use: t.Use})
}

// Stats returns the calls recorded so far.
func (r *StatsRecorder) Stats() SlotStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Slot is what one call of a slotted worker works with: its own stream, events that time the
// call's phases, device buffers and pinned host buffers, grown to the largest tensor and kept.
type Slot struct {
	Stream  Stream
	Events  [4]Event // recorded before the upload, after it, after the kernels, after the download
	Bufs    []DeviceBuffer
	HostIn  []byte // pinned
	HostOut []byte // pinned
}

// NewSlot creates a slot's stream and events, with bufs device buffers not yet allocated. On
// an error the half-made slot is released.
func (d *Device) NewSlot(bufs int) (*Slot, error) {
	s := &Slot{Bufs: make([]DeviceBuffer, bufs)}
	var err error
	if s.Stream, err = d.NewStream(); err != nil {
		return nil, err
	}
	for i := range s.Events {
		if s.Events[i], err = d.NewEvent(); err != nil {
			return nil, errors.Join(err, d.ReleaseSlot(s))
		}
	}
	return s, nil
}

// ReleaseSlot frees the slot's buffers, events and stream (the zero values were never made).
func (d *Device) ReleaseSlot(s *Slot) error {
	var errs []error
	for i := range s.Bufs {
		errs = append(errs, d.Release(&s.Bufs[i]))
	}
	for _, h := range []*[]byte{&s.HostIn, &s.HostOut} {
		if *h != nil {
			errs = append(errs, d.FreeHost(*h))
			*h = nil
		}
	}
	for i, e := range s.Events {
		if e != 0 {
			errs = append(errs, d.DestroyEvent(e))
			s.Events[i] = 0
		}
	}
	if s.Stream != 0 {
		errs = append(errs, d.DestroyStream(s.Stream))
		s.Stream = 0
	}
	return errors.Join(errs...)
}

// PhaseTimes sets t's upload, kernel and download times from the slot's four events, once the
// stream has reached the last.
func (d *Device) PhaseTimes(s *Slot, t *CallTimes) error {
	for i, phase := range []*time.Duration{&t.Upload, &t.Kernels, &t.Download} {
		var err error
		if *phase, err = d.Elapsed(s.Events[i], s.Events[i+1]); err != nil {
			return err
		}
	}
	return nil
}
