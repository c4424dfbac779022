package cuda

import (
	"fmt"
	"slices"
	"time"
)

// Timing is the median of repeated device-timed runs of one operation.
type Timing struct {
	Median      time.Duration
	Runs        int
	BytesPerRun int64 // bytes read plus bytes written by one run
}

// BytesPerSecond is the throughput of the median run.
func (t Timing) BytesPerSecond() float64 {
	return float64(t.BytesPerRun) / t.Median.Seconds()
}

func (t Timing) String() string {
	return fmt.Sprintf("median %v over %d runs, %.1f GB/s", t.Median, t.Runs, t.BytesPerSecond()/1e9)
}

// TimeOnStream runs op on stream s `warmup` times untimed, then `runs` times each between two
// events, and returns the median device time. bytes is what one run reads plus writes.
func (d *Device) TimeOnStream(s Stream, warmup, runs int, bytes int64, op func() error) (Timing, error) {
	if runs < 1 {
		return Timing{}, fmt.Errorf("cuda: TimeOnStream needs at least one run")
	}
	start, err := d.NewEvent()
	if err != nil {
		return Timing{}, err
	}
	defer d.DestroyEvent(start)
	end, err := d.NewEvent()
	if err != nil {
		return Timing{}, err
	}
	defer d.DestroyEvent(end)
	for range warmup {
		if err := op(); err != nil {
			return Timing{}, err
		}
	}
	times := make([]time.Duration, runs)
	for i := range times {
		if err := d.Record(start, s); err != nil {
			return Timing{}, err
		}
		if err := op(); err != nil {
			return Timing{}, err
		}
		if err := d.Record(end, s); err != nil {
			return Timing{}, err
		}
		if times[i], err = d.Elapsed(start, end); err != nil {
			return Timing{}, err
		}
	}
	slices.Sort(times)
	return Timing{Median: times[runs/2], Runs: runs, BytesPerRun: bytes}, nil
}

// CopyBandwidth measures device-to-device copy throughput (cuMemcpyDtoD of `bytes`, counting
// bytes read plus written): the memory-bandwidth ceiling that kernel benchmarks compare with.
func (d *Device) CopyBandwidth(bytes, runs int) (Timing, error) {
	src, err := d.Alloc(bytes)
	if err != nil {
		return Timing{}, err
	}
	defer d.Free(src)
	dst, err := d.Alloc(bytes)
	if err != nil {
		return Timing{}, err
	}
	defer d.Free(dst)
	if err := d.Fill32(src, 0x3f800001, bytes/4); err != nil { // not zeros: see METHOD.md
		return Timing{}, err
	}
	s, err := d.NewStream()
	if err != nil {
		return Timing{}, err
	}
	defer d.DestroyStream(s)
	return d.TimeOnStream(s, 3, runs, 2*int64(bytes), func() error { return d.CopyDeviceAsync(dst, src, bytes, s) })
}
