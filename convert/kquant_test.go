package convert

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// tiny in every k-quant (rows of 128 and 384: partial super-blocks): the plan's and the
// report's bits per weight are the written bytes, and perplexity falls with the code width
// (q6_k within 2% of the unquantized model).
func TestKQuantTiny(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	base := tinyPerplexity(t, tiny)
	prev := 0.0
	for _, name := range []string{"q2_k", "q3_k", "q4_k", "q5_k", "q6_k"} {
		s, _ := quant.ParseScheme(name)
		opt := DefaultOptions()
		opt.Alloc, opt.Format = Uniform(s), "qpack"
		plan, err := Plan(tiny, opt)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), name)
		r, err := Convert(tiny, dst, opt)
		if err != nil {
			t.Fatal(err)
		}
		if r.QuantBPW != plan.Totals.CandidateBPW {
			t.Errorf("%s: the report says %.4f bits per weight, the plan %.4f", name, r.QuantBPW, plan.Totals.CandidateBPW)
		}
		p := tinyPerplexity(t, dst)
		t.Logf("%s: %.3f bits per weight, perplexity %.3f (unquantized %.3f)", name, r.QuantBPW, p, base)
		if prev != 0 && !(p < prev) {
			t.Errorf("%s: perplexity %.3f is not below the narrower k-quant's %.3f", name, p, prev)
		}
		prev = p
	}
	if prev > 1.02*base {
		t.Errorf("q6_k: perplexity %.3f, more than 2%% above the unquantized %.3f", prev, base)
	}
}

// What k-quants cannot do is refused before anything is written, naming the tensor: another
// layout, rows of partial sub-blocks. --device cuda (and auto) sends them to the GPU's k-quant fit,
// with or without --imatrix; without a GPU, --device cuda fails clearly.
func TestKQuantRefusals(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	q4, _ := quant.ParseScheme("q4_k")
	opt := DefaultOptions()
	opt.Alloc = Uniform(q4)
	for _, format := range []string{"gptq", "awq", "compressed-tensors"} {
		opt.Format = format
		_, err := Plan(tiny, opt)
		if err == nil || !strings.Contains(err.Error(), "tensor model.layers.0.") || !strings.Contains(err.Error(), "use format qpack") {
			t.Errorf("%s: %v, want a refusal naming a tensor and format qpack", format, err)
		}
	}

	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	ts := []safetensors.WriterTensor{safetensors.BytesTensor("model.layers.0.mlp.up_proj.weight", safetensors.F32, []int{64, 48}, make([]byte, 4*64*48))}
	if err := safetensors.WriteFile(filepath.Join(src, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	opt.Format = "qpack"
	_, err := Convert(src, filepath.Join(dir, "out"), opt)
	if err == nil || !strings.Contains(err.Error(), "tensor model.layers.0.mlp.up_proj.weight") || !strings.Contains(err.Error(), "not a multiple of its sub-block of 32") {
		t.Errorf("K = 48 in q4_k: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Error("a refused conversion left its output")
	}

	g := &gpu{q: &blockwise.GPUQuantizer{}, imatrix: &blockwise.GPUImatrix{}, kq: &kquant.GPUFitter{}} // no device is touched
	items := []Item{{Info: safetensors.TensorInfo{Name: "model.layers.0.mlp.up_proj.weight"}, Scheme: &q4}}
	for _, imatrix := range []bool{false, true} {
		if err := checkDevicePlan(g, DeviceCUDA, items, packing.QPack{}, Options{Imatrix: imatrix}); err != nil {
			t.Errorf("--device cuda (imatrix %v) refused a k-quant: %v", imatrix, err)
		}
		if !g.fits(q4, Options{Imatrix: imatrix}) || g.supports(q4, packing.QPack{}, Options{Imatrix: imatrix}) || g.searches(q4, Options{Imatrix: imatrix}) {
			t.Errorf("imatrix %v: a k-quant does not go to the GPU's k-quant fit", imatrix)
		}
	}
	int4 := quant.Scheme{Bits: 4, GroupSize: 128}
	if err := checkDevicePlan(g, DeviceCUDA, []Item{{Scheme: &int4}}, packing.QPack{}, Options{}); err != nil {
		t.Errorf("int4 on the GPU refused: %v", err)
	}
	if g.fits(int4, Options{}) || (&gpu{}).fits(q4, Options{}) {
		t.Error("int4, or a k-quant before useKQuants loaded the fit, sent to the k-quant fit")
	}

	// Without a GPU, --device cuda fails before anything is written, saying why.
	if dev, err := cuda.Open(0); err == nil {
		dev.Close()
		return
	}
	opt.Device = DeviceCUDA
	out := filepath.Join(dir, "cuda")
	if _, err := Convert(tiny, out, opt); err == nil || !strings.Contains(err.Error(), "--device cuda: ") {
		t.Errorf("q4_k with --device cuda and no GPU: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Error("a conversion refused for want of a GPU left its output")
	}
}
