package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConvertPTXIsFresh(t *testing.T) {
	if err := CheckPTX(convertPTX, convertSource); err != nil {
		t.Fatalf("kernels/convert.ptx: %v", err)
	}
}

func TestCheckPTXDetectsStaleness(t *testing.T) {
	src := []byte("extern \"C\" __global__ void k() {}\n")
	ptx := []byte(PTXHeader("k.cu", src, "-arch=compute_80 -ptx") + "\n.version 8.0\n")
	if err := CheckPTX(ptx, src); err != nil {
		t.Fatalf("fresh PTX rejected: %v", err)
	}
	edited := append([]byte("// edit\n"), src...)
	if err := CheckPTX(ptx, edited); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("edited source: got %v, want a staleness error", err)
	}
	if err := CheckPTX([]byte(".version 8.0\n"), src); err == nil {
		t.Fatal("PTX without header accepted")
	}
}

func TestMissingDriverIsErrNoDriver(t *testing.T) {
	_, err := loadDriver([]string{"libqpack-no-such-driver.so.1"})
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("got %v, want ErrNoDriver", err)
	}
	if !strings.Contains(err.Error(), "libqpack-no-such-driver.so.1") {
		t.Errorf("error %q does not name the library tried", err)
	}
}

// noGPUReason is why this machine has no usable GPU (ErrNoDriver or ErrNoGPU), or nil when it
// has one.
func noGPUReason(t *testing.T) error {
	t.Helper()
	_, err := Devices()
	if err == nil {
		return nil
	}
	if !errors.Is(err, ErrNoDriver) && !errors.Is(err, ErrNoGPU) {
		t.Fatalf("no GPU, for a reason that is neither ErrNoDriver nor ErrNoGPU: %v", err)
	}
	return err
}

func TestOpenWithoutGPUSaysSo(t *testing.T) {
	reason := noGPUReason(t)
	if reason == nil {
		t.Skip("a GPU is present")
	}
	_, err := Open(0)
	if !errors.Is(err, ErrNoDriver) && !errors.Is(err, ErrNoGPU) {
		t.Fatalf("Open without a GPU: %v, want ErrNoDriver or ErrNoGPU", err)
	}
	r := Describe()
	if r.DriverErr == nil || !strings.Contains(r.String(), "runs on the CPU") {
		t.Errorf("Describe without a GPU:\n%s", r)
	}
}

// A driver that sees no GPU answers CUDA_ERROR_NO_DEVICE; that, and only that code, is ErrNoGPU.
func TestNoDeviceCodeIsErrNoGPU(t *testing.T) {
	noDevice := &Error{Call: "cuInit", Code: 100, Name: "CUDA_ERROR_NO_DEVICE"}
	if !errors.Is(noDevice, ErrNoGPU) || !errors.Is(fmt.Errorf("--device cuda: %w", noDevice), ErrNoGPU) {
		t.Error("CUDA_ERROR_NO_DEVICE is not ErrNoGPU")
	}
	outOfMemory := &Error{Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	if errors.Is(outOfMemory, ErrNoGPU) || errors.Is(noDevice, ErrNoDriver) {
		t.Error("an unrelated error matches ErrNoGPU, or no-device matches ErrNoDriver")
	}
}

func TestKernelParamsLayout(t *testing.T) {
	params, err := kernelParams([]any{DevicePtr(0x1234), int32(-1), uint32(7), int64(-2), 5, uint64(1 << 40), float32(1.5), 2.5})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{0x1234, 0xffffffff, 7, math.MaxUint64 - 1, 5, 1 << 40, uint64(math.Float32bits(1.5)), math.Float64bits(2.5)}
	for i := range want {
		if params[i] != want[i] {
			t.Errorf("param %d: %#x, want %#x", i, params[i], want[i])
		}
	}
	if _, err := kernelParams([]any{"text"}); err == nil {
		t.Error("string argument accepted")
	}
}

func TestLibrarySearchTriesEnvDirFirst(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "libcublas.so.13")
	if err := os.WriteFile(fake, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(LibraryDirEnv, dir)
	if got := LibrarySearchDirs()[0]; got != dir {
		t.Fatalf("first search dir %q, want %q", got, dir)
	}
	for _, lib := range FindLibraries() {
		if lib.Name != "cublas" {
			continue
		}
		if lib.Path == fake {
			t.Fatal("a file that is not a library was reported as loaded")
		}
		if lib.Err != nil && !strings.Contains(lib.Err.Error(), fake) {
			t.Errorf("failure %q does not mention the file tried first", lib.Err)
		}
		t.Log(lib)
	}
}

// TestSelect: "cpu" never opens a GPU, an unknown choice is an error naming it, and without a
// driver or without a GPU "auto" falls back to the CPU silently while "cuda" fails saying why.
func TestSelect(t *testing.T) {
	if dev, note, err := Select(ChoiceCPU); dev != nil || note != "" || err != nil {
		t.Errorf("cpu: %v %q %v", dev, note, err)
	}
	if _, _, err := Select("tpu"); err == nil || !strings.Contains(err.Error(), `"tpu"`) {
		t.Errorf("tpu: error %v", err)
	}
	reason := noGPUReason(t)
	if reason == nil {
		t.Skip("a GPU is present")
	}
	if dev, note, err := Select(ChoiceAuto); dev != nil || note != "" || err != nil {
		t.Errorf("auto without a GPU: %v %q %v", dev, note, err)
	}
	_, _, err := Select(ChoiceCUDA)
	if err == nil || !strings.Contains(err.Error(), "--device cuda") || !strings.Contains(err.Error(), reason.Error()) {
		t.Errorf("cuda without a GPU: error %v, want one naming --device cuda and %q", err, reason)
	}
}

// TestCopyParallel: copyParallel copies what copy copies, for pieces below and above its
// threshold and destinations shorter and longer than the source.
func TestCopyParallel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ dst, src int }{{10, 10}, {100, 50}, {2<<20 + 1, 8 << 20}, {5<<20 + 7, 5<<20 + 7}, {50 << 20, 40 << 20}, {33 << 20, 64<<20 + 3}} {
		src := make([]byte, c.src)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		got, want := make([]byte, c.dst), make([]byte, c.dst)
		n, m := copyParallel(got, src), copy(want, src)
		if n != m || !bytes.Equal(got, want) {
			t.Fatalf("dst %d, src %d: copied %d bytes, want %d, equal %v", c.dst, c.src, n, m, bytes.Equal(got, want))
		}
	}
}

// A slow driver call is named in a trace by the function that called do, past the closures and
// do, wait and call themselves.
func TestCallerOfDoNamesTheCaller(t *testing.T) {
	var got string
	func() { got = callerOfDoFromTraceSlow() }()
	if got != "TestCallerOfDoNamesTheCaller" {
		t.Errorf("callerOfDo = %q, want TestCallerOfDoNamesTheCaller", got)
	}
}

// callerOfDoFromTraceSlow stands where traceSlow does: callerOfDo's caller.
func callerOfDoFromTraceSlow() string { return callerOfDo() }
