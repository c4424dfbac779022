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
// of TestGPUFitMatchesCPU's tensors and must give QuantizeRow's tensors byte for byte, the
// status words that make TestGPUFitRefusals' errors, and (rows of whole super-blocks) the pack
// kernel must give AppendRow's ggml blocks of them. What it cannot check is nvcc itself: that the
// intrinsics compile to single roundings on the GPU.
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
		if n <= 0 || k <= 0 || len(w) != n*k {
			return nil, fmt.Errorf("kquant: %d weights for a %dx%d tensor", len(w), n, k)
		}
		j, err := newFitJob(cuda.F32, n, k, s, imp)
		if err != nil {
			return nil, err
		}
		q := quant.NewKQuantTensor(s, n, k)
		status, blocks, err := runOnHost(bin, j.kt, q, w, imp)
		if err != nil {
			return nil, err
		}
		scales := func(i int) (d, dmin float32, err error) {
			if j.kt.Mins {
				dmin = q.Mins[i]
			}
			return q.Scales[i], dmin, nil
		}
		if err := j.refusal(status, func(i int) float32 { return w[i] }, scales); err != nil {
			return nil, err
		}
		if want := encodeRows(j.kt, q); !bytes.Equal(blocks, want) {
			return nil, fmt.Errorf("the pack kernel's %d bytes differ from AppendRow's %d (first at %d)", len(blocks), len(want), firstDiff(blocks, want))
		}
		return q, nil
	}
	checkFits(t, quantize)
	checkRefusals(t, quantize)
}

// encodeRows is every row of q as ggml blocks (AppendRow), or nil when its rows are not whole
// super-blocks.
func encodeRows(kt *Type, q *quant.Tensor) []byte {
	if q.K%quant.SuperBlock != 0 {
		return nil
	}
	var out []byte
	for n := range q.N {
		out, _ = kt.AppendRow(out, q, n)
	}
	return out
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// runOnHost runs the fit kernel of kt on the CPU (kernels/host/host.cpp), reads its outputs into
// q, and returns its status words and the pack kernel's blocks (none when the rows are not whole
// super-blocks or the status found something).
func runOnHost(bin string, kt *Type, q *quant.Tensor, w, imp []float32) (status [2]uint64, blocks []byte, err error) {
	hasImp := 0
	if imp != nil {
		hasImp = 1
	}
	cmd := exec.Command(bin, fmt.Sprint(kt.Bits), fmt.Sprint(q.N), fmt.Sprint(q.K), fmt.Sprint(hasImp))
	cmd.Stdin = io.MultiReader(bytes.NewReader(cuda.Bytes(w)), bytes.NewReader(cuda.Bytes(imp)))
	out, err := cmd.Output()
	if err != nil {
		return status, nil, fmt.Errorf("%s: %w", bin, err)
	}
	r := bytes.NewReader(out)
	for _, b := range append([][]byte{cuda.Bytes(status[:])}, kernelOutputs(q)...) {
		if _, err := io.ReadFull(r, b); err != nil {
			return status, nil, fmt.Errorf("%s: reading its output: %w", bin, err)
		}
	}
	blocks, _ = io.ReadAll(r)
	if len(blocks) == 0 {
		blocks = nil
	}
	return status, blocks, nil
}
