package iquant

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/quant"
)

// hostCXX names a C++ compiler (g++ 12 or newer: _Float16) for TestKernelOnCPU:
// go test ./iquant -run KernelOnCPU -args -iquant.hostcxx=g++
var hostCXX = flag.String("iquant.hostcxx", "", "compile kernels/iquant.cu for the CPU with this C++ compiler and test it")

// TestKernelOnCPU checks the transcription of the Go fits in kernels/iquant.cu without a GPU:
// the kernel source, compiled for the CPU with kquant's stand-ins for the CUDA built-ins (each
// operation rounded once; a NaN result is the GPU's canonical NaN), runs every block of
// TestGPUFitMatchesCPU's tensors, with GPUFitter's handling of flagged rows, and must give
// Quantize's tensors byte for byte, and TestGPUFitRefusals' errors. What it cannot check is nvcc
// itself: that the intrinsics compile to single roundings on the GPU.
func TestKernelOnCPU(t *testing.T) {
	if *hostCXX == "" {
		t.Skip("-iquant.hostcxx not set (a C++ compiler to run kernels/iquant.cu on the CPU)")
	}
	bin := filepath.Join(t.TempDir(), "iquant-host")
	cmd := exec.Command(*hostCXX, "-O2", "-ffp-contract=off", "-std=c++17", "-I", "../kquant/kernels/host", "-I", "kernels", "-o", bin, "kernels/host/host.cpp")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd, err, out)
	}
	var cpuRows int
	quantize := func(w []float32, n, k int, s quant.Scheme, imp []float32) (*quant.Tensor, error) {
		return fitTensor(w, n, k, s, imp, func(t *Type, q *quant.Tensor, flags []uint8) error {
			return runOnHost(bin, t, q, w, imp, flags)
		}, &cpuRows)
	}
	checkFits(t, quantize)
	checkRefusals(t, quantize)
	// The kernel must fit nearly every row itself: only rows with a sub-block of zero importance,
	// all-zero IQ1 sub-blocks or data the CPU refuses go back (53 of checkFits' 1,035 rows).
	if cpuRows > 100 {
		t.Errorf("%d rows fitted again on the CPU", cpuRows)
	}
}

// runOnHost runs the kernel for type t on the CPU (kernels/host/host.cpp) and reads its outputs
// into q and flags.
func runOnHost(bin string, t *Type, q *quant.Tensor, w, imp []float32, flags []uint8) error {
	hasImp, dim, shift := 0, t.Dim, 0
	var tables [][]byte
	counts := [3]int{}
	if t.lat != nil {
		lat := t.lat()
		shift, tables = lat.shift, latticeBytes(lat)
		counts = [3]int{len(lat.levels), len(lat.kmap), len(lat.neighbours)}
	}
	if imp != nil {
		hasImp = 1
	}
	cmd := exec.Command(bin, fmt.Sprint(int(t.Type)), fmt.Sprint(q.N), fmt.Sprint(q.K), fmt.Sprint(hasImp), fmt.Sprint(dim),
		fmt.Sprint(shift), fmt.Sprint(counts[0]), fmt.Sprint(counts[1]), fmt.Sprint(counts[2]))
	in := []io.Reader{bytes.NewReader(cuda.Bytes(w)), bytes.NewReader(cuda.Bytes(imp))}
	for _, b := range tables {
		in = append(in, bytes.NewReader(b))
	}
	cmd.Stdin = io.MultiReader(in...)
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	r := bytes.NewReader(out)
	for _, b := range append(kernelOutputs(q), flags) {
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("%s: reading its output: %w", bin, err)
		}
	}
	if r.Len() != 0 {
		return fmt.Errorf("%s: %d bytes more than the tensor", bin, r.Len())
	}
	return nil
}
