package model

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/ebitengine/purego"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/internal/shares"
)

// nccl is the part of NCCL's API that an all-reduce of the Hessians would use, loaded through
// purego: only this benchmark loads it, to measure it against SumUpperShards (issue 23 asked
// for both). NCCL ships with PyTorch (site-packages/nvidia/nccl/lib); QPACK_NCCL names the
// library, else the loader's search path is tried.
type nccl struct {
	version        func(v *int32) int32
	commInitAll    func(comms *uintptr, n int32, devs *int32) int32
	commDestroy    func(comm uintptr) int32
	allReduce      func(send, recv uintptr, count uint64, dtype, op int32, comm, stream uintptr) int32
	groupStart     func() int32
	groupEnd       func() int32
	getErrorString func(r int32) string
}

const (
	ncclFloat32 = 7
	ncclSum     = 0
)

func loadNCCL(tb testing.TB) *nccl {
	tb.Helper()
	name := os.Getenv("QPACK_NCCL")
	if name == "" {
		name = "libnccl.so.2"
	}
	lib, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		tb.Skipf("NCCL not found (%v): set QPACK_NCCL to libnccl.so.2", err)
	}
	n := &nccl{}
	for _, f := range []struct {
		fptr any
		name string
	}{{&n.version, "ncclGetVersion"}, {&n.commInitAll, "ncclCommInitAll"}, {&n.commDestroy, "ncclCommDestroy"},
		{&n.allReduce, "ncclAllReduce"}, {&n.groupStart, "ncclGroupStart"}, {&n.groupEnd, "ncclGroupEnd"},
		{&n.getErrorString, "ncclGetErrorString"}} {
		sym, err := purego.Dlsym(lib, f.name)
		if err != nil {
			tb.Fatalf("%s: %v", f.name, err)
		}
		purego.RegisterFunc(f.fptr, sym)
	}
	return n
}

func (n *nccl) check(tb testing.TB, call string, r int32) {
	tb.Helper()
	if r != 0 {
		tb.Fatalf("%s: NCCL error %d (%s)", call, r, n.getErrorString(r))
	}
}

// BenchmarkGPUHessianSum sums one k×k float32 Gram matrix from every GPU (GPU i holding its
// partial one) into every GPU, the two ways issue 23 named: SumUpperShards, as a conversion does
// (each GPU adds its band of the upper triangle over the links and writes it into every
// matrix, then each mirrors its own), and NCCL's all-reduce of the whole matrices (in place, on
// the engines' streams, then the mirror too). Wall time of each round, all GPUs waited for,
// median of 10 after a warm-up. Needs two or more GPUs that reach each other's memory.
func BenchmarkGPUHessianSum(b *testing.B) {
	gpus, err := cuda.Devices()
	if err != nil || len(gpus) < 2 {
		b.Skip("needs two or more GPUs")
	}
	lib := loadNCCL(b)
	var version int32
	lib.check(b, "ncclGetVersion", lib.version(&version))
	cfg := mustConfig(b, gpuTestConfigs[0].json)
	for _, n := range []int{2, 4, 8} {
		if n > len(gpus) {
			break
		}
		devs := gputest.OpenMany(b, n)
		if _, err := cuda.EnablePeerAccess(devs); err != nil {
			b.Fatal(err)
		}
		es := make([]*GPU, n)
		for i, dev := range devs {
			if es[i], err = newGPU(dev, cfg, GPUOptions{}, gputest.PTX(b, modelPTX, *gpuPTX), gputest.Cubins(*gpuPTX, modelCubinSM90)...); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { es[i].Close() })
		}
		comms := make([]uintptr, n)
		ordinals := make([]int32, n)
		for i := range ordinals {
			ordinals[i] = int32(i)
		}
		lib.check(b, "ncclCommInitAll", lib.commInitAll(&comms[0], int32(n), &ordinals[0]))
		b.Cleanup(func() {
			for _, c := range comms {
				lib.commDestroy(c)
			}
		})
		for _, k := range []int{4096, 11008, 28672} {
			sums := make([]cuda.DevicePtr, n)
			for i, dev := range devs {
				if sums[i], err = dev.Alloc(4 * k * k); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { dev.Free(sums[i]) })
				if err := dev.Fill32(sums[i], 0x3c23d70a+uint32(i), k*k); err != nil {
					b.Fatal(err)
				}
			}
			mirror := func() error { return eachEngine(es, func(i int, e *GPU) error { return e.FinishGram(sums[i], k) }) }
			waitAll := func() error { return eachEngine(es, func(_ int, e *GPU) error { return e.Synchronize() }) }
			bands := shares.Upper(k, n)
			ways := []struct {
				name string
				run  func() error
			}{
				{"peer kernel", func() error {
					err := eachEngine(es, func(i int, e *GPU) error {
						if err := e.SumUpperShards(sums, k, bands[i], bands[i+1]); err != nil {
							return err
						}
						return e.Synchronize()
					})
					if err == nil {
						err = mirror()
					}
					return err
				}},
				{"NCCL all-reduce", func() error {
					runtime.LockOSThread() // NCCL's group is the calling thread's
					defer runtime.UnlockOSThread()
					if r := lib.groupStart(); r != 0 {
						return fmt.Errorf("ncclGroupStart: %s", lib.getErrorString(r))
					}
					for i, e := range es {
						p := uintptr(sums[i])
						if r := lib.allReduce(p, p, uint64(k*k), ncclFloat32, ncclSum, comms[i], uintptr(e.Stream())); r != 0 {
							lib.groupEnd()
							return fmt.Errorf("ncclAllReduce: %s", lib.getErrorString(r))
						}
					}
					if r := lib.groupEnd(); r != 0 {
						return fmt.Errorf("ncclGroupEnd: %s", lib.getErrorString(r))
					}
					err := waitAll()
					if err == nil {
						err = mirror()
					}
					return err
				}},
			}
			for _, w := range ways {
				times := make([]time.Duration, 0, 10)
				for run := range 11 {
					start := time.Now()
					err := w.run()
					if err == nil {
						err = waitAll()
					}
					if err != nil {
						b.Fatalf("%s: %v", w.name, err)
					}
					if run > 0 {
						times = append(times, time.Since(start))
					}
				}
				slices.Sort(times)
				med := times[len(times)/2]
				bytes := float64(4 * k * k)
				b.Logf("TABLE %d GPUs, k=%d, %s (NCCL %d): %.2f ms, %.1f GB/s of one matrix", n, k, w.name, version,
					float64(med.Microseconds())/1e3, bytes/med.Seconds()/1e9)
			}
		}
	}
}
