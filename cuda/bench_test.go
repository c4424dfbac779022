package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// Run with -test.benchtime=1x: each benchmark times ≥ 20 runs with CUDA events itself and
// reports the median; the copy bandwidth is the ceiling measured on the same GPU.

const benchRuns = 25

func BenchmarkCopyDeviceToDevice(b *testing.B) {
	d := openTestDevice(b)
	tm, err := d.CopyBandwidth(512<<20, max(b.N, benchRuns))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(tm.BytesPerSecond()/1e9, "GB/s")
	b.ReportMetric(float64(tm.Median.Microseconds()), "µs/copy")
	b.Logf("%s: D2D copy of 512 MiB: %s", d.Info().Name, tm)
}

func BenchmarkConvertF16ToF32(b *testing.B)  { benchmarkConvert(b, F16) }
func BenchmarkConvertBF16ToF32(b *testing.B) { benchmarkConvert(b, BF16) }

func benchmarkConvert(b *testing.B, typ DType) {
	d := openTestDevice(b)
	const n = 64 << 20 // 128 MiB in, 256 MiB out
	src, err := d.Alloc(n * typ.Size())
	if err != nil {
		b.Fatal(err)
	}
	defer d.Free(src)
	dst, err := d.Alloc(4 * n)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Free(dst)
	r := rand.New(rand.NewPCG(7, 8))
	d.CopyToDevice(src, randomBytes(r, n*typ.Size()))
	s, _ := d.NewStream()
	defer d.DestroyStream(s)
	bytes := int64(n * (typ.Size() + 4))
	tm, err := d.TimeOnStream(s, 3, max(b.N, benchRuns), bytes, func() error { return d.ConvertToF32(dst, src, typ, n, s) })
	if err != nil {
		b.Fatal(err)
	}
	ceiling, err := d.CopyBandwidth(int(bytes/2), benchRuns) // a copy moving the same bytes
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(tm.BytesPerSecond()/1e9, "GB/s")
	b.ReportMetric(tm.BytesPerSecond()/ceiling.BytesPerSecond(), "of-copy-bw")
	b.Logf("%s: %s→F32 of %d elements: %s; D2D copy of the same bytes: %s", d.Info().Name, typ, n, tm, ceiling)
}

// BenchmarkStagerToDevice copies 256 MiB of Go memory to the device through stagers of 8 to
// 64 MiB (their two halves alternate): how small the pinned buffers of the calibration engines
// and GPTQ solvers may be before uploads slow down (pinning costs time at setup, more so with
// several GPUs). Bytes per second of the whole copy, host copies into the halves included.
func BenchmarkStagerToDevice(b *testing.B) {
	d := openTestDevice(b)
	const size = 256 << 20
	src := randomBytes(rand.New(rand.NewPCG(3, 4)), size)
	dst, err := d.Alloc(size)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Free(dst)
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer d.DestroyStream(s)
	for _, mib := range []int{8, 16, 32, 64} {
		b.Run(fmt.Sprintf("stager=%dMiB", mib), func(b *testing.B) {
			st, err := d.NewStager(mib << 20)
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			b.SetBytes(size)
			for b.Loop() {
				if err := st.CopyToDevice(dst, src, s); err != nil {
					b.Fatal(err)
				}
				if err := d.SynchronizeStream(s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
