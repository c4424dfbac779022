package convert

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/imatrix"
	"github.com/qpack-dev/qpack/internal/testenv"
)

// TestImatrixMatchesLlamaCppEval measures mid-llama's importance on the CPU over 128 × 512
// tokens of calib.txt, writes it as an imatrix file, and compares it with llama-imatrix's over
// the same tokens (package imatrix's testdata: llama.cpp c392e509, an F16 GGUF export, 128
// chunks of 512, no BOS): every entry under the same name, every channel within 2e-3
// (measured: 4e-4 at most, 1.2e-4 in relative L2 — llama.cpp multiplies in F16).
func TestImatrixMatchesLlamaCppEval(t *testing.T) {
	if os.Getenv("QPACK_EVAL") != "1" {
		t.Skip("set QPACK_EVAL=1 for the imatrix comparison on mid-llama")
	}
	src := testenv.Shared(t, "models/mid-llama")
	out := filepath.Join(t.TempDir(), "imatrix.dat")
	o := ImatrixOptions{Device: DeviceCPU, Calib: CalibOptions{File: testenv.Shared(t, "models/calib.txt"), Samples: 128, SeqLen: 512}}
	if err := WriteImatrix(src, out, o); err != nil {
		t.Fatal(err)
	}
	got, err := imatrix.Read(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := imatrix.Read(filepath.Join("..", "imatrix", "testdata", "mid-llama.imatrix"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Entries) != len(want.Entries) || got.Chunks != 128 || !strings.HasSuffix(got.Dataset, "calib.txt") {
		t.Fatalf("%d entries (want %d), %d chunks, dataset %q", len(got.Entries), len(want.Entries), got.Chunks, got.Dataset)
	}
	var worst float64
	for _, w := range want.Entries {
		g, ok := got.Lookup(w.Name)
		if !ok || len(g) != len(w.Mean) {
			t.Fatalf("%s: qpack's file has %d values, llama.cpp's %d", w.Name, len(g), len(w.Mean))
		}
		for i := range g {
			rel := math.Abs(float64(g[i]-w.Mean[i])) / math.Abs(float64(w.Mean[i]))
			worst = max(worst, rel)
			if rel > 2e-3 {
				t.Errorf("%s channel %d: qpack %g, llama.cpp %g", w.Name, i, g[i], w.Mean[i])
				break
			}
		}
	}
	t.Logf("largest relative difference from llama-imatrix: %.2g", worst)
}
