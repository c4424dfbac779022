package evaluate

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/internal/testenv"
)

// The same held-out data as ids and as text gives the same perplexity (the tokenizer
// reproduces the reference ids), and a model compared with itself has zero divergence.
func TestEvalIdsTextAndSelfReference(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	a, err := Run(tiny, Options{Data: filepath.Join(tiny, "heldout_ids.npy"), MaxSeqs: 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(tiny, Options{Data: filepath.Join(tiny, "heldout.txt"), MaxSeqs: 2, Reference: tiny})
	if err != nil {
		t.Fatal(err)
	}
	if a.Perplexity != b.Perplexity || a.Tokens != 2*511 {
		t.Errorf("ids %v (%d tokens) vs text %v", a.Perplexity, a.Tokens, b.Perplexity)
	}
	if b.MeanKL != 0 || b.Top1Agreement != 1 || b.DeltaPerplexity != 0 {
		t.Errorf("self comparison: KL %v top1 %v Δ %v", b.MeanKL, b.Top1Agreement, b.DeltaPerplexity)
	}
}

// A quantized checkpoint evaluates through its packed layout; verify passes and fails on
// thresholds around the measured values.
func TestVerifyQuantized(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	q := filepath.Join(t.TempDir(), "q")
	opt := convert.DefaultOptions()
	opt.Alloc = convert.Uniform(convert.DefaultScheme)
	if _, err := convert.Convert(tiny, q, opt); err != nil {
		t.Fatal(err)
	}
	r, err := Run(q, Options{Data: filepath.Join(tiny, "heldout_ids.npy"), MaxSeqs: 2, Reference: tiny})
	if err != nil {
		t.Fatal(err)
	}
	if r.MeanKL <= 0 || r.Top1Agreement >= 1 || r.Top1Agreement < 0.5 || math.IsNaN(r.Perplexity) {
		t.Fatalf("implausible comparison %+v", r)
	}
	if err := (Thresholds{MaxKL: r.MeanKL * 1.01, MinTop1: r.Top1Agreement * 0.99}).Check(r); err != nil {
		t.Errorf("thresholds just above the measurement failed: %v", err)
	}
	err = Thresholds{MaxKL: r.MeanKL * 0.99, MaxPerplexityIncrease: 1e-6}.Check(r)
	if err == nil || !strings.Contains(err.Error(), "mean KL") || !strings.Contains(err.Error(), "perplexity increase") {
		t.Errorf("want both violations reported, got %v", err)
	}
	if err := (Thresholds{MaxKL: 1}).Check(&Report{Perplexity: 3}); err == nil {
		t.Errorf("a KL threshold without a reference should be an error")
	}
}

func TestBadData(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	if _, err := Run(tiny, Options{Data: "/nonexistent.npy"}); err == nil {
		t.Errorf("missing data file should fail")
	}
	if _, err := Run(tiny, Options{Data: filepath.Join(tiny, "probe_logits.npy")}); err == nil {
		t.Errorf("float .npy as ids should fail")
	}
}

// A GGUF file evaluates like its source: an F32 export gives the source's perplexity with ids
// and with text (tokenized by the tokenizer in the file's metadata), and a Q8_0 export compared
// with the source checkpoint shows a small, non-zero divergence.
func TestEvalGGUF(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	dir := t.TempDir()
	f32, q8 := filepath.Join(dir, "f32.gguf"), filepath.Join(dir, "q8.gguf")
	for path, typ := range map[string]string{f32: "f32", q8: "q8_0"} {
		if _, err := ggufexport.Export(tiny, path, ggufexport.Options{Type: typ, EmbedType: "f32"}); err != nil {
			t.Fatal(err)
		}
	}
	src, err := Run(tiny, Options{Data: filepath.Join(tiny, "heldout_ids.npy"), MaxSeqs: 2})
	if err != nil {
		t.Fatal(err)
	}
	text, err := Run(f32, Options{Data: filepath.Join(tiny, "heldout.txt"), MaxSeqs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if text.Perplexity != src.Perplexity {
		t.Errorf("F32 GGUF on text: perplexity %v, source %v", text.Perplexity, src.Perplexity)
	}
	q, err := Run(q8, Options{Data: filepath.Join(tiny, "heldout_ids.npy"), MaxSeqs: 2, Reference: tiny})
	if err != nil {
		t.Fatal(err)
	}
	if q.MeanKL <= 0 || q.MeanKL > 1e-3 || q.Top1Agreement < 0.95 {
		t.Errorf("Q8_0 GGUF against the source: KL %v, top-1 %v", q.MeanKL, q.Top1Agreement)
	}
}
