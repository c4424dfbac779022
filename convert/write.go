package convert

import (
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/qpack-dev/qpack/safetensors"
)

// unit is one step of writing the output: copying a kept tensor, or quantizing, packing and
// writing one module. Each writes its tensors at their places in the output files, which the
// header fixed before any data, so units finish in any order.
type unit func(out *safetensors.CheckpointWriter) error

// runUnits runs units in order, at most workers at once, so that at most that many modules'
// inputs and results are in memory while reading, quantizing and writing overlap. It returns
// the error of the first failed unit, after which no unit starts.
func runUnits(out *safetensors.CheckpointWriter, units []unit, workers int) error {
	var next atomic.Int64
	var failed atomic.Bool
	errs := make([]error, len(units))
	var wg sync.WaitGroup
	for range max(1, min(workers, len(units))) {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(units) {
					return
				}
				if errs[i] = units[i](out); errs[i] != nil {
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// writeTimer adds up the time units spend writing, over all of them.
type writeTimer struct{ nanos atomic.Int64 }

// write writes one output tensor and counts the time.
func (w *writeTimer) write(out *safetensors.CheckpointWriter, name string, data []byte) error {
	start := time.Now()
	err := out.Write(name, data)
	w.nanos.Add(int64(time.Since(start)))
	return err
}

func (w *writeTimer) seconds() float64 { return time.Duration(w.nanos.Load()).Seconds() }

// lockedWriter serializes writes to w, so that lines logged from several goroutines stay whole.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
