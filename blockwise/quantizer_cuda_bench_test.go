package blockwise

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/quant"
)

// BenchmarkGPUQuantize times quantize+pack of device-resident BF16 tensors (no transfers; one F16
// case, GPTQ int4 g128, whose kernel serves both 16-bit dtypes):
// effective bandwidth = (input bytes + packed output bytes) / median time of CUDA-event-timed
// batches, against a device-to-device copy of the same inputs timed the same way. Inputs
// rotate over enough buffers to exceed the L2 cache. Run with -test.benchtime=1x; each
// sub-benchmark prints a "TABLE" line.
// benchTileBlocks sets how many blocks the tile kernels launch (0: the quantizer's default), to
// compare a persistent grid with one block per tile: -blockwise.tileblocks=1000000000.
var benchTileBlocks = flag.Int("blockwise.tileblocks", 0, "blocks of the tile kernels in BenchmarkGPUQuantize (0: default)")

func BenchmarkGPUQuantize(b *testing.B) {
	dev, q := openGPUQuantizer(b)
	if *benchTileBlocks > 0 {
		q.tileBlocks = *benchTileBlocks
	}
	big, err := dev.CopyBandwidth(1<<30, 21)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("TABLE %s: D2D copy 1 GiB: %.2f TB/s\n", dev.Info().Name, big.BytesPerSecond()/1e12)
	type benchCase struct {
		label  string
		n, k   int
		s      quant.Scheme
		format string
		dtype  string
	}
	int4 := quant.Scheme{Bits: 4, GroupSize: 128, Grid: quant.Integer}
	cases := []benchCase{
		{"0.5M", 512, 1024, int4, "gptq", "BF16"},
		{"1M", 1024, 1024, int4, "gptq", "BF16"},
		{"5M", 2048, 2560, int4, "gptq", "BF16"},
		{"10M", 4096, 2560, int4, "gptq", "BF16"},
		{"50M-F16", 8192, 6144, int4, "gptq", "F16"},
	}
	// Every scheme family × layout of issue 16 that the GPU quantizer does, at 50M and 180M.
	for _, size := range []struct {
		label string
		n, k  int
	}{{"50M", 8192, 6144}, {"180M", 4 * 11008, 4096}} {
		for _, c := range []struct{ scheme, format string }{
			{"int4-g128-asym", "gptq"}, {"int4-g128-asym", "qpack"}, {"int8-g128-asym", "gptq"},
			{"int8-g128-asym", "qpack"}, {"nf4-g64", "qpack"}, {"nf4-g128", "qpack"}, {"int4-pc-asym", "gptq"},
			{"int8-pc-asym", "gptq"}, {"int4-pc-asym", "qpack"}, {"int4-g32-asym", "qpack"}, {"int2-g64-asym", "qpack"},
			{"int3-g128-asym", "gptq"}, {"bin-g128-asym", "qpack"},
		} {
			s, err := quant.ParseScheme(c.scheme)
			if err != nil {
				b.Fatal(err)
			}
			cases = append(cases, benchCase{size.label, size.n, size.k, s, c.format, "BF16"})
		}
	}
	for _, c := range cases {
		b.Run(fmt.Sprintf("%s/%s/%s", c.label, c.s, c.format), func(b *testing.B) {
			j, err := newGPUJob(c.dtype, c.n, c.k, c.s, c.format, "bench", 0)
			if err != nil {
				b.Fatal(err)
			}
			benchGPUJob(b, dev, q, c.label, j)
		})
	}
}

// benchGPUJob times job j's kernels against a copy of its input (see BenchmarkGPUQuantize).
// NVFP4 without a given global scale runs two passes, bw_fp4_amax and the quantization: each is
// also timed alone, on its own TABLE line, against the same copy.
func benchGPUJob(b *testing.B, dev *cuda.Device, q *GPUQuantizer, label string, j gpuJob) {
	n, k, s, format := j.n, j.k, j.s, j.format
	ptrs, err := q.buffers(q.all[0], j)
	if err != nil {
		b.Fatal(err)
	}
	if s.IsFP4() { // the given global scale (bw_fp4_amax raises the word from 0 otherwise)
		if err := dev.CopyToDevice(ptrs[bufParamScale], j.fp4InitWord()); err != nil {
			b.Fatal(err)
		}
	}
	sizes := j.deviceBytes()
	in := sizes[bufInput]
	moved := int64(in + sizes[bufCodes] + sizes[bufScales] + sizes[bufZeros] + sizes[bufOffsets])
	rotate := min(256, max(2, (512<<20+in-1)/in))
	inputs, err := gpuRandomInputs(dev, rotate, in, gpuDTypeNames[j.dtype])
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, p := range inputs {
			dev.Free(p)
		}
	}()
	copyDst, err := dev.Alloc(in)
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Free(copyDst)
	st, err := dev.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer dev.DestroyStream(st)
	runs := max(b.N, 21)
	// timed runs op on every input buffer, runs times, counting bytes per buffer.
	timed := func(bytes int64, op func(p cuda.DevicePtr) error) cuda.Timing {
		t, err := dev.TimeOnStream(st, 1, runs, bytes*int64(rotate), func() error {
			for _, p := range inputs {
				if err := op(p); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			err = dev.SynchronizeStream(st)
		}
		if err != nil {
			b.Fatal(err)
		}
		return t
	}
	withInput := func(p cuda.DevicePtr) [numBufs]cuda.DevicePtr { ptrs[bufInput] = p; return ptrs }
	kernel := timed(moved, func(p cuda.DevicePtr) error { return q.enqueue(j, withInput(p), st) })
	copied := timed(2*int64(in), func(p cuda.DevicePtr) error { return dev.CopyDeviceAsync(copyDst, p, in, st) })
	bw, cbw := kernel.BytesPerSecond(), copied.BytesPerSecond()
	b.ReportMetric(bw/1e12, "TB/s")
	b.ReportMetric(bw/cbw, "of-copy")
	// NVFP4 without a given global scale reads W twice (bw_fp4_amax first): the line also says
	// what the kernels moved, both reads counted.
	twoPass := s.Grid == quant.NVFP4 && j.global == 0
	both := ""
	if twoPass {
		all := bw * float64(moved+int64(in)) / float64(moved)
		both = fmt.Sprintf("  (both reads counted: %5.2f TB/s, %5.1f%% of copy)", all/1e12, 100*all/cbw)
	}
	fmt.Printf("TABLE %-5s %-6s %-18s %6.1fM elems  %7.1f us  %5.2f TB/s  copy %5.2f TB/s  %5.1f%% of copy%s\n",
		label, format, s, float64(n*k)/1e6, kernel.Median.Seconds()*1e6/float64(rotate), bw/1e12, cbw/1e12, 100*bw/cbw, both)
	if !twoPass {
		return
	}
	// Each pass alone: bw_fp4_amax reads W; the quantization (the word now holds amax(W), which
	// every input shares) reads W and writes the packed bytes.
	for _, pass := range []struct {
		name  string
		bytes int64
		op    func(p cuda.DevicePtr) error
	}{
		{"amax pass", int64(in), func(p cuda.DevicePtr) error { return q.launchFP4Amax(j, withInput(p), st) }},
		{"quantization pass", moved, func(p cuda.DevicePtr) error { return q.launchFP4Quantize(j, withInput(p), st) }},
	} {
		t := timed(pass.bytes, pass.op)
		pbw := t.BytesPerSecond()
		b.ReportMetric(pbw/cbw, strings.Fields(pass.name)[0]+"-of-copy")
		fmt.Printf("TABLE %-5s %-6s %-18s %6.1fM elems  %-17s %7.1f us  %5.2f TB/s  copy %5.2f TB/s  %5.1f%% of copy\n",
			label, format, s, float64(n*k)/1e6, pass.name+":", t.Median.Seconds()*1e6/float64(rotate), pbw/1e12, cbw/1e12, 100*pbw/cbw)
	}
}

// gpuDTypeNames names the dtype codes of gpuDTypes.
var gpuDTypeNames = [3]string{"BF16", "F16", "F32"}

// gpuRandomInputs allocates count device buffers of bytes each, filled with Gaussian weights
// (σ = 0.02) of dtype; a 16 MiB random pattern repeated.
func gpuRandomInputs(dev *cuda.Device, count, bytes int, dtype string) ([]cuda.DevicePtr, error) {
	r := rand.New(rand.NewPCG(5, 6))
	w := make([]float32, min(bytes, 16<<20)/2)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.02)
	}
	pattern, _ := encodeWeights(w, dtype)
	pattern = pattern[:min(len(pattern), bytes)]
	var ptrs []cuda.DevicePtr
	for range count {
		p, err := dev.Alloc(bytes)
		if err != nil {
			for _, q := range ptrs {
				dev.Free(q)
			}
			return nil, err
		}
		ptrs = append(ptrs, p)
		for at := 0; at < bytes; at += len(pattern) {
			if err := dev.CopyToDevice(p.Add(at), pattern[:min(len(pattern), bytes-at)]); err != nil {
				return nil, err
			}
		}
	}
	return ptrs, nil
}
