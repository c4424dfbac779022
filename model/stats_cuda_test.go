package model

import (
	"math"
	"testing"
	"unsafe"

	"github.com/qpack-dev/qpack/cuda"
)

// TestGPUChannelStatsMatchesCPU compares the GPU's per-channel Σx² and Σ|x| with
// AddChannelStats on fresh random inputs of awkward sizes, accumulating twice into outputs
// that start non-zero, as calibration does over chunks of sequences.
func TestGPUChannelStatsMatchesCPU(t *testing.T) {
	cfg := mustConfig(t, gpuTestConfigs[0].json)
	e := openGPU(t, cfg, GPUOptions{}, 0)
	r := freshRand(t)
	for _, size := range []struct{ rows, cols int }{{1, 1}, {255, 97}, {257, 300}, {3000, 1031}} {
		rows, cols := size.rows, size.cols
		want := make([]float64, cols)
		wantAbs := make([]float64, cols)
		for j := range cols {
			want[j], wantAbs[j] = r.Float64(), r.Float64()
		}
		sq, abs := upload(t, e, want), upload(t, e, wantAbs)
		for range 2 {
			x := make([]float32, rows*cols)
			for i := range x {
				x[i] = float32(r.NormFloat64() * 3)
			}
			if err := AddChannelStats(want, wantAbs, x, rows, cols); err != nil {
				t.Fatal(err)
			}
			dx := upload(t, e, x)
			if err := e.AddChannelStats(sq, abs, dx, rows, cols); err != nil {
				t.Fatal(err)
			}
			if err := e.Synchronize(); err != nil {
				t.Fatal(err)
			}
			e.dev.Free(dx)
		}
		got, gotAbs := download[float64](t, e, sq, cols), download[float64](t, e, abs, cols)
		for j := range cols {
			if d := math.Abs(got[j]-want[j]) / want[j]; !(d < 1e-12) {
				t.Fatalf("%d×%d: channel %d Σx² %v, want %v", rows, cols, j, got[j], want[j])
			}
			if d := math.Abs(gotAbs[j]-wantAbs[j]) / wantAbs[j]; !(d < 1e-12) {
				t.Fatalf("%d×%d: channel %d Σ|x| %v, want %v", rows, cols, j, gotAbs[j], wantAbs[j])
			}
		}
		e.dev.Free(sq)
		e.dev.Free(abs)
	}
}

func upload[T float32 | float64](t *testing.T, e *GPU, v []T) cuda.DevicePtr {
	t.Helper()
	var z T
	p, err := e.dev.Alloc(len(v) * int(unsafe.Sizeof(z)))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.dev.CopyToDevice(p, cuda.Bytes(v)); err != nil {
		t.Fatal(err)
	}
	return p
}

func download[T float32 | float64](t *testing.T, e *GPU, p cuda.DevicePtr, n int) []T {
	t.Helper()
	v := make([]T, n)
	if err := e.dev.CopyFromDevice(cuda.Bytes(v), p); err != nil {
		t.Fatal(err)
	}
	return v
}

// BenchmarkGPUChannelStats: per-channel Σx² and Σ|x| of a 65536×4096 float32 input (128
// sequences of 512 tokens into a 7B's q/k/v), bytes read per second against the device copy
// of the same bytes measured in the same run.
func BenchmarkGPUChannelStats(b *testing.B) {
	cfg := mustConfig(b, gpuTestConfigs[0].json)
	e := openGPU(b, cfg, GPUOptions{}, 0)
	e.poison = false
	const rows, cols = 65536, 4096
	x, err := e.floats("bench.x", rows*cols)
	if err != nil {
		b.Fatal(err)
	}
	if err := e.dev.Fill32(x, 0x3c23d70a, rows*cols); err != nil { // 0.01: not zeros
		b.Fatal(err)
	}
	sums, err := e.work("bench.sums", 16*cols)
	if err != nil {
		b.Fatal(err)
	}
	bytes := int64(4 * rows * cols)
	stats, err := e.dev.TimeOnStream(e.stream, 3, 21, bytes, func() error {
		return e.AddChannelStats(sums, sums.Add(8*cols), x, rows, cols)
	})
	if err != nil {
		b.Fatal(err)
	}
	copyT, err := e.dev.CopyBandwidth(int(bytes), 21)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(stats.BytesPerSecond()/1e12, "TB/s")
	b.ReportMetric(stats.BytesPerSecond()/copyT.BytesPerSecond(), "of-copy")
	b.Logf("channel stats %d×%d: %v; device copy of the same bytes: %v", rows, cols, stats, copyT)
}
