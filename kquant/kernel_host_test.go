package kquant

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
// go test ./kquant -run KernelOnCPU -args -kquant.hostcxx=g++
var hostCXX = flag.String("kquant.hostcxx", "", "compile kernels/kquant.cu for the CPU with this C++ compiler and test it")

// TestKernelOnCPU checks the transcription of the Go fit in kernels/kquant.cu without a GPU:
// the kernel source, compiled for the CPU with kernels/host's stand-ins for the CUDA built-ins
// (each operation rounded once; a NaN result is the GPU's canonical NaN), runs every super-block
// of TestGPUFitMatchesCPU's tensors and must give QuantizeRow's tensors byte for byte, and
// TestGPUFitRefusals' errors. What it cannot check is nvcc itself: that the intrinsics compile to
// single roundings on the GPU.
func TestKernelOnCPU(t *testing.T) {
	if *hostCXX == "" {
		t.Skip("-kquant.hostcxx not set (a C++ compiler to run kernels/kquant.cu on the CPU)")
	}
	bin := filepath.Join(t.TempDir(), "kquant-host")
	cmd := exec.Command(*hostCXX, "-O2", "-ffp-contract=off", "-std=c++17", "-I", "kernels/host", "-I", "kernels", "-o", bin, "kernels/host/host.cpp")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd, err, out)
	}
	quantize := func(w []float32, n, k int, s quant.Scheme, imp []float32) (*quant.Tensor, error) {
		return fitTensor(w, n, k, s, imp, func(kt *Type, q *quant.Tensor) error { return runOnHost(bin, kt, q, w, imp) })
	}
	checkFits(t, quantize)
	checkRefusals(t, quantize)
}

// runOnHost runs the kernel of kt on the CPU (kernels/host/host.cpp) and reads its outputs into q.
func runOnHost(bin string, kt *Type, q *quant.Tensor, w, imp []float32) error {
	hasImp := 0
	if imp != nil {
		hasImp = 1
	}
	cmd := exec.Command(bin, fmt.Sprint(kt.Bits), fmt.Sprint(q.N), fmt.Sprint(q.K), fmt.Sprint(hasImp))
	cmd.Stdin = io.MultiReader(bytes.NewReader(cuda.Bytes(w)), bytes.NewReader(cuda.Bytes(imp)))
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	r := bytes.NewReader(out)
	for _, b := range kernelOutputs(q) {
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("%s: reading its output: %w", bin, err)
		}
	}
	if r.Len() != 0 {
		return fmt.Errorf("%s: %d bytes more than the tensor", bin, r.Len())
	}
	return nil
}
