package convert

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/qpack-dev/qpack/safetensors"
)

// ReadResult is how long reading some bytes took.
type ReadResult struct {
	Bytes   int64
	Seconds float64
}

// GBps is the read rate in GB/s.
func (r ReadResult) GBps() float64 { return float64(r.Bytes) / r.Seconds / 1e9 }

func (r ReadResult) String() string {
	return fmt.Sprintf("%d bytes in %.3fs = %.2f GB/s", r.Bytes, r.Seconds, r.GBps())
}

// ReadTensors reads every tensor of the checkpoint at src the way Convert's GPU path reads the
// weights it quantizes: in file order, `workers` at once (the GPU conversion's workers,
// DefaultGPUSlots + 1, when workers ≤ 0), each with read calls into a buffer of its
// own (a GPU slot's pinned staging buffer there). Whatever of the files is in the page cache
// stays there.
func ReadTensors(src string, workers int) (ReadResult, error) {
	if workers <= 0 {
		workers = DefaultGPUSlots + 1
	}
	start := time.Now()
	ck, err := safetensors.Open(src)
	if err != nil {
		return ReadResult{}, err
	}
	defer ck.Close()
	buffers := make(chan []byte, workers)
	for range workers {
		buffers <- nil
	}
	var units []unit
	var total int64
	for _, h := range ck.Headers() {
		for _, info := range h.Tensors {
			total += info.Size
			units = append(units, func(tensorSink) error {
				buf := <-buffers
				if int64(cap(buf)) < info.Size {
					buf = make([]byte, info.Size)
				}
				err := ck.ReadInto(info.Name, buf[:info.Size])
				buffers <- buf
				return err
			})
		}
	}
	if err := runUnits(nil, units, workers); err != nil {
		return ReadResult{}, err
	}
	return ReadResult{Bytes: total, Seconds: time.Since(start).Seconds()}, nil
}

// ReadFiles reads the checkpoint's safetensors files whole, one after another, with plain
// read calls (like cat): the baseline that ReadTensors is compared with.
func ReadFiles(src string) (ReadResult, error) {
	ck, err := safetensors.Open(src)
	if err != nil {
		return ReadResult{}, err
	}
	paths := ck.Files()
	ck.Close()
	start := time.Now()
	var total int64
	buf := make([]byte, 4<<20)
	for _, p := range paths {
		n, err := readFile(p, buf)
		if err != nil {
			return ReadResult{}, err
		}
		total += n
	}
	return ReadResult{Bytes: total, Seconds: time.Since(start).Seconds()}, nil
}

// readFile reads the file through buf and returns its size.
func readFile(path string, buf []byte) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var total int64
	for {
		n, err := f.Read(buf)
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("%s: %w", path, err)
		}
	}
}
