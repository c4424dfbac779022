// Package gputest opens the GPU for tests: it skips a test on a machine without an NVIDIA
// driver or GPU, and lets a GPU run load freshly compiled PTX instead of the embedded kernels.
package gputest

import (
	"errors"
	"os"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
)

// Open opens GPU 0, closed when the test ends; without a driver or a GPU the test is skipped.
func Open(tb testing.TB) *cuda.Device {
	tb.Helper()
	gpus, err := cuda.Devices()
	if errors.Is(err, cuda.ErrNoDriver) {
		tb.Skip("no NVIDIA driver: ", err)
	}
	if errors.Is(err, cuda.ErrNoGPU) {
		tb.Skip("driver present but no GPU: ", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	if len(gpus) == 0 {
		tb.Skip("driver present but no GPU")
	}
	dev, err := cuda.Open(0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { dev.Close() })
	return dev
}

// PTX returns the kernels to load: the file named by override (a test flag such as
// -blockwise.ptx, for PTX compiled on the GPU machine) or else the embedded ones.
func PTX(tb testing.TB, embedded []byte, override string) []byte {
	tb.Helper()
	if override == "" {
		return embedded
	}
	ptx, err := os.ReadFile(override)
	if err != nil {
		tb.Fatal(err)
	}
	return ptx
}

// Cubins returns the machine code a test loads beside the kernels: none where a PTX override
// is given (that PTX alone is tried), else cubins.
func Cubins(override string, cubins ...[]byte) [][]byte {
	if override != "" {
		return nil
	}
	return cubins
}

// OpenMany opens n handles on the GPUs round-robin — GPU i mod the number of GPUs — closed when
// the test ends, so that code for several GPUs runs on one too (each handle then shares GPU 0's
// context, and copies between them are copies within it); without a GPU the test is skipped.
func OpenMany(tb testing.TB, n int) []*cuda.Device {
	tb.Helper()
	devs := []*cuda.Device{Open(tb)}
	gpus, err := cuda.Devices()
	if err != nil {
		tb.Fatal(err)
	}
	for i := 1; i < n; i++ {
		dev, err := cuda.Open(i % len(gpus))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { dev.Close() })
		devs = append(devs, dev)
	}
	return devs
}

// Floats copies v to new memory on dev, freed when the test ends.
func Floats(tb testing.TB, dev *cuda.Device, v []float32) cuda.DevicePtr {
	tb.Helper()
	p, err := dev.Alloc(4 * max(len(v), 1))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { dev.Free(p) })
	if err := dev.CopyToDevice(p, cuda.Bytes(v)); err != nil {
		tb.Fatal(err)
	}
	return p
}
