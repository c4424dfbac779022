package model

import (
	"errors"
	"sync"

	"github.com/qpack-dev/qpack/cuda"
)

// A block's weights on the GPU (float32, and their 16-bit copy) go when the block is done and the
// same amounts come back for a later block. Freeing waits for the device's work and, like
// allocating, takes the driver a few milliseconds per buffer, more on several GPUs at once: the
// GPUs sat idle between blocks for that (2 ms with one GPU, 9–11 ms with four). So a block's
// buffers are kept as spares, each with an event recorded after the last kernel that reads it,
// and a later block of the same sizes takes them once the event has passed.

// maxSpares is how many spare buffers an engine keeps; the oldest beyond it are freed.
const maxSpares = 4

type spareBuffer struct {
	ptr  cuda.DevicePtr
	size int
	done cuda.Event // recorded on the engine's stream when the buffer was given back
}

// spares is an engine's spare block buffers (the calibration and the uploads ahead use them from
// two goroutines).
type spares struct {
	mu   sync.Mutex
	bufs []spareBuffer
}

// allocBlock returns a device buffer of size bytes for a block: a spare of that size once its
// last reader is done, or a new one.
func (e *GPU) allocBlock(size int) (cuda.DevicePtr, error) {
	e.spare.mu.Lock()
	for i, s := range e.spare.bufs {
		if s.size == size {
			e.spare.bufs = append(e.spare.bufs[:i], e.spare.bufs[i+1:]...)
			e.spare.mu.Unlock()
			if err := e.settle(s); err != nil {
				e.dev.Free(s.ptr)
				return 0, err
			}
			return s.ptr, nil
		}
	}
	e.spare.mu.Unlock()
	return e.dev.Alloc(size)
}

// releaseBlock gives back a block buffer that allocBlock returned, after the work queued on the
// engine's stream so far (the last that reads it): kept as a spare, or freed when that fails.
func (e *GPU) releaseBlock(p cuda.DevicePtr, size int) error {
	if p == 0 {
		return nil
	}
	done, err := e.dev.NewEvent()
	if err == nil {
		if err = e.dev.Record(done, e.stream); err != nil {
			e.dev.DestroyEvent(done)
		}
	}
	if err != nil { // free it the slow way
		if err := e.Synchronize(); err != nil {
			return err
		}
		return e.dev.Free(p)
	}
	e.spare.mu.Lock()
	e.spare.bufs = append(e.spare.bufs, spareBuffer{p, size, done})
	var oldest []spareBuffer
	if n := len(e.spare.bufs) - maxSpares; n > 0 {
		oldest = append(oldest, e.spare.bufs[:n]...)
		e.spare.bufs = append(e.spare.bufs[:0], e.spare.bufs[n:]...)
	}
	e.spare.mu.Unlock()
	return e.freeSpares(oldest)
}

// spareBytes is the memory the engine's spares hold.
func (e *GPU) spareBytes() uint64 {
	e.spare.mu.Lock()
	defer e.spare.mu.Unlock()
	var n uint64
	for _, s := range e.spare.bufs {
		n += uint64(s.size)
	}
	return n
}

// settle waits until spare s's last reader is done and drops its event.
func (e *GPU) settle(s spareBuffer) error {
	err := e.dev.SynchronizeEvent(s.done)
	e.dev.DestroyEvent(s.done)
	return err
}

// freeSpares frees bufs once their last readers are done.
func (e *GPU) freeSpares(bufs []spareBuffer) error {
	var errs []error
	for _, s := range bufs {
		err := e.settle(s)
		if err == nil {
			err = e.dev.Free(s.ptr)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// closeSpares frees every spare (Close).
func (e *GPU) closeSpares() error {
	e.spare.mu.Lock()
	bufs := e.spare.bufs
	e.spare.bufs = nil
	e.spare.mu.Unlock()
	return e.freeSpares(bufs)
}
