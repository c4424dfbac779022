package cuda

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/qpack-dev/qpack/internal/timeline"
)

// Stager copies pageable host memory (Go slices) to and from the device through a pinned
// buffer, ordered on a stream. A cuMemcpyHtoD straight from pageable memory ran at about 1 GB/s
// on the H200 machine while other goroutines worked; a host copy into pinned memory plus an
// asynchronous DMA runs near memcpy speed. The synchronous copies also run on the legacy default
// stream, which waits for every other stream's work (and holds the device's lock meanwhile);
// the stager's wait only for their own stream. The buffer's two halves alternate, so the host
// copy of one piece overlaps the DMA of the next. Not safe for concurrent use.
type Stager struct {
	d      *Device
	buf    []byte
	halves [2][]byte
	done   [2]Event
	queued [2]bool
}

// DefaultStagingBytes is the pinned memory qpack's stagers use: two 16 MiB halves, each copied
// into by 8 goroutines (copyParallel) while the other's DMA runs. Smaller ones upload slower
// (BenchmarkStagerToDevice, four H100s' host: 16.4, 17.7, 27.8 and 27.2 GB/s with stagers of 8,
// 16, 32 and 64 MiB); larger ones take longer to pin, the more so the more GPUs there are, as
// pinned memory is mapped for every GPU of the process (with 64 MiB stagers four H100s took
// 0.45 s to make their engines and solvers, with 16 MiB 0.2 s).
const DefaultStagingBytes = 32 << 20

// NewStager allocates a stager with bytes of pinned memory (at least 2).
func (d *Device) NewStager(bytes int) (*Stager, error) {
	defer timeline.Begin(d.Info().Ordinal, "pinned staging")()
	if bytes < 2 {
		return nil, fmt.Errorf("cuda: NewStager(%d): need at least 2 bytes", bytes)
	}
	s := &Stager{d: d}
	var err error
	if s.buf, err = d.AllocHost(bytes); err != nil {
		return nil, err
	}
	half := bytes / 2
	s.halves = [2][]byte{s.buf[:half], s.buf[half : 2*half]}
	for i := range s.done {
		if s.done[i], err = d.NewEvent(); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// CopyToDevice queues the copy of src to dst on stream; src may change as soon as it returns,
// dst holds the data once the stream reaches this point.
func (s *Stager) CopyToDevice(dst DevicePtr, src []byte, stream Stream) error {
	for i, off := 0, 0; off < len(src); i++ {
		h := i % 2
		if s.queued[h] { // the DMA out of this half must be done before it is overwritten
			if err := s.d.SynchronizeEvent(s.done[h]); err != nil {
				return err
			}
		}
		n := copyParallel(s.halves[h], src[off:])
		if err := s.d.CopyToDeviceAsync(dst.Add(off), s.halves[h][:n], stream); err != nil {
			return err
		}
		if err := s.d.Record(s.done[h], stream); err != nil {
			return err
		}
		s.queued[h] = true
		off += n
	}
	return nil
}

// CopyFromDevice copies len(dst) bytes at src into dst once the work queued on stream before
// it has finished, and returns when dst holds them.
func (s *Stager) CopyFromDevice(dst []byte, src DevicePtr, stream Stream) error {
	half := len(s.halves[0])
	queue := func(off int) error { // the DMA of the piece at off into its half
		h := (off / half) % 2
		if s.queued[h] {
			if err := s.d.SynchronizeEvent(s.done[h]); err != nil {
				return err
			}
		}
		n := min(half, len(dst)-off)
		if err := s.d.CopyFromDeviceAsync(s.halves[h][:n], src.Add(off), stream); err != nil {
			return err
		}
		s.queued[h] = true
		return s.d.Record(s.done[h], stream)
	}
	if len(dst) == 0 {
		return nil
	}
	if err := queue(0); err != nil {
		return err
	}
	for off := 0; off < len(dst); off += half {
		if next := off + half; next < len(dst) {
			if err := queue(next); err != nil {
				return err
			}
		}
		h := (off / half) % 2
		if err := s.d.SynchronizeEvent(s.done[h]); err != nil {
			return err
		}
		s.queued[h] = false
		copyParallel(dst[off:], s.halves[h][:min(half, len(dst)-off)])
	}
	return nil
}

// Close waits for queued copies and frees the pinned memory.
func (s *Stager) Close() error {
	var first error
	for i, e := range s.done {
		if e == 0 {
			continue
		}
		if s.queued[i] {
			if err := s.d.SynchronizeEvent(e); err != nil && first == nil {
				first = err
			}
		}
		if err := s.d.DestroyEvent(e); err != nil && first == nil {
			first = err
		}
	}
	if s.buf != nil {
		if err := s.d.FreeHost(s.buf); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// copyParallel is copy(dst, src) over up to 8 goroutines, each at least a MiB: one core's copy
// into pinned memory (6 to 9 GB/s on the H100 machines) bounded a calibration's weight uploads,
// while the DMA behind it runs several times faster. With 4 MiB a goroutine, a stager's halves
// had to be 32 MiB for 8 copies at once (BenchmarkStagerToDevice, four H100s' host: stagers of
// 8, 16, 32 and 64 MiB ran at 8.8, 13.6, 17.1 and 22.7 GB/s).
func copyParallel(dst, src []byte) int {
	n := min(len(dst), len(src))
	const piece = 1 << 20
	workers := min(runtime.GOMAXPROCS(0), 8, n/piece)
	if workers < 2 {
		return copy(dst, src[:n])
	}
	per := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for at := 0; at < n; at += per {
		end := min(at+per, n)
		wg.Go(func() { copy(dst[at:end], src[at:end]) })
	}
	wg.Wait()
	return n
}
