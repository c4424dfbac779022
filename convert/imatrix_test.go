package convert

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
	"github.com/qpack-dev/qpack/safetensors"
)

// RTN with --imatrix: every linear's activation-weighted error Σ E[x²]·(w − ŵ)² is at most
// plain RTN's (the search keeps min-max unless it is strictly better) and lower in total; the
// provenance records the option; without calibration it is refused. K-quants (ggml's imatrix
// fitting, which weighs E[x²] with the weights' own spread) are checked in total only.
func TestRTNImatrix(t *testing.T) {
	q3k, _ := quant.ParseScheme("q3_k")
	for _, c := range []struct {
		s         quant.Scheme
		perTensor bool
		gain      float64 // the least relative drop of the summed error energy
	}{{quant.Scheme{Bits: 3, GroupSize: 64}, true, 0.1}, {q3k, false, 0.05}} {
		t.Run(c.s.String(), func(t *testing.T) { testRTNImatrix(t, c.s, c.perTensor, c.gain) })
	}
}

func testRTNImatrix(t *testing.T, s quant.Scheme, perTensor bool, gain float64) {
	tiny := testenv.Testdata(t, "models/tiny")
	dir := t.TempDir()
	opt := DefaultOptions()
	opt.Alloc, opt.Format, opt.Imatrix = Uniform(s), "qpack", true
	if _, err := Convert(tiny, filepath.Join(dir, "x"), opt); err == nil || !strings.Contains(err.Error(), "--imatrix needs calibration") {
		t.Fatalf("--imatrix without --calib: %v", err)
	}
	opt.Calib = CalibOptions{File: testenv.Testdata(t, "models/tiny/heldout.txt"), Samples: 4, SeqLen: 128}
	if _, err := Convert(tiny, filepath.Join(dir, "w"), opt); err != nil {
		t.Fatal(err)
	}
	plain := opt
	plain.Imatrix = false
	if _, err := Convert(tiny, filepath.Join(dir, "p"), plain); err != nil {
		t.Fatal(err)
	}
	calib, err := opt.calibration(tiny)
	if err != nil {
		t.Fatal(err)
	}
	imp, _, err := measureImportance(context.Background(), tiny, calib, DeviceCPU, nil, "", ExpertOptions{}, func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	wc, _ := quantized.Open(filepath.Join(dir, "w"))
	defer wc.Close()
	if !strings.Contains(wc.Metadata()[ProvenanceKey], `"imatrix":true`) {
		t.Errorf("provenance does not record imatrix")
	}
	pc, _ := quantized.Open(filepath.Join(dir, "p"))
	defer pc.Close()
	in, _ := safetensors.Open(tiny)
	defer in.Close()
	var sumW, sumP float64
	for _, name := range in.Names() {
		module := model.ParseTensorName(name).Module
		v, ok := imp[module]
		if !ok || !strings.HasSuffix(name, ".weight") {
			continue
		}
		info, _ := in.Info(name)
		n, k := info.Shape[0], info.Shape[1]
		w, _ := in.Float32(name)
		ww, err := wc.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		pw, _ := pc.Float32(name)
		ew := quant.WeightedRelativeError(w, ww, n, k, v)
		ep := quant.WeightedRelativeError(w, pw, n, k, v)
		if perTensor && ew > ep*(1+1e-9) {
			t.Errorf("%s: weighted error %.4g with --imatrix above RTN's %.4g", name, ew, ep)
		}
		sumW += ew * ew
		sumP += ep * ep
	}
	t.Logf("%s: summed weighted error energy %.4g with --imatrix, %.4g without", s, sumW, sumP)
	if sumP == 0 || sumW > (1-gain)*sumP {
		t.Errorf("summed weighted error energy %.4g with --imatrix, %.4g without: want at least %.0f%% lower", sumW, sumP, 100*gain)
	}
}
