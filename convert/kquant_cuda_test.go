package convert

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/gputest"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

var q4k, _ = quant.KQuantScheme(4)

// TestGPUKQuantSameBytes: RTN to q4_k on --device cuda fits every linear of tiny on the GPU
// (the log says "on cuda" for each) and writes exactly the files of --device cpu, byte for
// byte; with --imatrix too, both conversions given the same importance (measured on the CPU:
// the GPU's TF32 calibration gives slightly different E[x²]).
func TestGPUKQuantSameBytes(t *testing.T) { checkGPUSameBytes(t, q4k) }

// checkGPUSameBytes converts tiny to s by RTN on --device cuda and on --device cpu, with and
// without --imatrix (the importance measured once, on the CPU: the GPU's TF32 calibration gives
// slightly different E[x²]): every linear must say "on cuda" and the files must be equal.
func checkGPUSameBytes(t *testing.T, s quant.Scheme) {
	gputest.Open(t) // skips without a GPU
	tiny := testenv.Testdata(t, "models/tiny")
	for _, imatrix := range []bool{false, true} {
		t.Run(map[bool]string{false: "rtn", true: "rtn-imatrix"}[imatrix], func(t *testing.T) {
			opt := DefaultOptions()
			opt.Alloc, opt.Format = Uniform(s), "qpack"
			if imatrix {
				useCPUImportance(t, tiny, &opt)
			}
			gpuDir, cpuDir, log := convertOnBoth(t, tiny, opt)
			if n := strings.Count(log, " on cuda "); n != 28 || strings.Contains(log, " on cpu ") {
				t.Errorf("%d log lines say \"on cuda\", want every linear's (28):\n%s", n, log)
			}
			sameFiles(t, gpuDir, cpuDir)
		})
	}
}

// useCPUImportance sets --imatrix with the importance of src measured once, on the CPU (the
// GPU's TF32 calibration gives slightly different E[x²]), on 8 × 128 tokens of tiny's held-out
// text, so that conversions on both devices use the same.
func useCPUImportance(t *testing.T, src string, opt *Options) {
	t.Helper()
	opt.Imatrix = true
	opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 8, SeqLen: 128}
	calib, err := opt.calibration(src)
	if err != nil {
		t.Fatal(err)
	}
	if opt.importance, _, err = measureImportance(context.Background(), src, calib, DeviceCPU, nil, "", ExpertOptions{}, func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
}

// TestGPUGGUFSameBytes: --format gguf --preset Q4_K_M (q4_k and q6_k) on --device cuda fits and
// packs every linear of a BF16 synthetic Llama with whole super-blocks on the GPU (kquant's
// FitBlocks: the log says "on cuda" for each) and writes the file of --device cpu byte for
// byte, with and without an importance matrix (measured once, on the CPU).
func TestGPUGGUFSameBytes(t *testing.T) {
	gputest.Open(t) // skips without a GPU
	src := synthLlama(t)
	for _, imatrix := range []bool{false, true} {
		t.Run(map[bool]string{false: "rtn", true: "rtn-imatrix"}[imatrix], func(t *testing.T) {
			opt := DefaultOptions()
			opt.Format, opt.GGUF.Preset = "gguf", "Q4_K_M"
			if imatrix {
				useCPUImportance(t, src, &opt)
			}
			gpuFile, cpuFile, log := convertOnBoth(t, src, opt)
			if n := strings.Count(log, " on cuda "); n != 21 || strings.Contains(log, " on cpu ") {
				t.Errorf("%d log lines say \"on cuda\", want every linear's (21):\n%s", n, log)
			}
			got, err := os.ReadFile(gpuFile)
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(cpuFile)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the GPU's GGUF file (%d bytes) differs from the CPU's (%d bytes)", len(got), len(want))
			}
		})
	}
}

// convertOnBoth converts src with opt on --device cuda and on --device cpu, into two temporary
// paths (directories, or files for --format gguf), and returns them with the GPU conversion's
// log.
func convertOnBoth(t *testing.T, src string, opt Options) (gpuDir, cpuDir, gpuLog string) {
	t.Helper()
	dir := t.TempDir()
	gpuDir, cpuDir = filepath.Join(dir, "gpu"), filepath.Join(dir, "cpu")
	var log bytes.Buffer
	gpu, cpu := opt, opt
	gpu.Device, gpu.Log = DeviceCUDA, &log
	cpu.Device = DeviceCPU
	if _, err := Convert(src, gpuDir, gpu); err != nil {
		t.Fatal(err)
	}
	if _, err := Convert(src, cpuDir, cpu); err != nil {
		t.Fatal(err)
	}
	return gpuDir, cpuDir, log.String()
}

// sameFiles wants the directories to hold the same files with the same bytes.
func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	entries, err := os.ReadDir(b)
	if err != nil {
		t.Fatal(err)
	}
	if ea, _ := os.ReadDir(a); len(ea) != len(entries) {
		t.Errorf("%d files in %s, %d in %s", len(ea), a, len(entries), b)
	}
	for _, e := range entries {
		want, err := os.ReadFile(filepath.Join(b, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(a, e.Name())); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s differs between the GPU's and the CPU's conversion (%v)%s", e.Name(), err, differingTensors(a, b, e.Name()))
		}
	}
}

// differingTensors names the first tensors whose bytes differ between two safetensors files
// of one name in directories a and b ("" for other files).
func differingTensors(a, b, name string) string {
	if !strings.HasSuffix(name, ".safetensors") {
		return ""
	}
	differ, err := tensorsDiffering(a, b, name)
	if err != nil {
		return ": " + err.Error()
	}
	return fmt.Sprintf(": %d tensors differ, %s", len(differ), strings.Join(differ[:min(len(differ), 12)], " "))
}

// tensorsDiffering lists the tensors of the safetensors file name in directory b whose bytes
// differ in a's, or that a lacks.
func tensorsDiffering(a, b, name string) ([]string, error) {
	ca, err := safetensors.Open(filepath.Join(a, name))
	if err != nil {
		return nil, err
	}
	defer ca.Close()
	cb, err := safetensors.Open(filepath.Join(b, name))
	if err != nil {
		return nil, err
	}
	defer cb.Close()
	var differ []string
	for _, n := range cb.Names() {
		x, errA := ca.Bytes(n)
		y, errB := cb.Bytes(n)
		if errA != nil || errB != nil || !bytes.Equal(x, y) {
			differ = append(differ, n)
		}
	}
	return differ, nil
}
