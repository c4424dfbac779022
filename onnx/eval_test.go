package onnx

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

// checkPerplexity compares onnxruntime's perplexity of the export dst over 16 × 512 held-out
// tokens with qpack's own on the checkpoint src: within 0.5%.
func checkPerplexity(t *testing.T, src, dst string, ids []int) {
	t.Helper()
	const seqLen, seqs = 512, 16
	m, err := model.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want, err := model.Perplexity(m, ids, seqLen, seqs)
	if err != nil {
		t.Fatal(err)
	}
	cut, err := model.Sequences(ids, seqLen, seqs)
	if err != nil {
		t.Fatal(err)
	}
	got := ortPerplexity(t, dst, cut)
	if d := math.Abs(got/want.Perplexity - 1); d > 0.005 {
		t.Errorf("onnxruntime perplexity %.4f, qpack %.4f: %.3f%% apart, want ≤ 0.5%%", got, want.Perplexity, 100*d)
	} else {
		t.Logf("perplexity: onnxruntime %.4f, qpack %.4f (%.4f%% apart)", got, want.Perplexity, 100*d)
	}
}

// TestExportTinyPerplexity: the int4 MatMulNBits export of the tiny model scores the held-out
// text like qpack's own evaluation of the same checkpoint.
func TestExportTinyPerplexity(t *testing.T) {
	src := convertTiny(t, "int4-g128-asym", "gptq", false)
	ids := heldout(t, tinyDir(t), 16*512)
	dst, _ := checkExport(t, src, ids[:64], Options{})
	checkPerplexity(t, src, dst, ids)
}

// TestExportSmallLlamaShared exports the shared small-llama, plain and quantized with each kind
// of ops, and checks logits, the KV cache and perplexity against qpack's forward pass.
func TestExportSmallLlamaShared(t *testing.T) {
	src := testenv.Shared(t, "models/small-llama")
	if testing.Short() || os.Getenv("QPACK_EVAL") != "1" {
		t.Skip("set QPACK_EVAL=1 (and no -short) for the small-llama ONNX evaluation")
	}
	ids := heldout(t, src, 16*512)
	quantize := func(s quant.Scheme) string {
		opt := convert.DefaultOptions()
		opt.Alloc = convert.Uniform(s)
		opt.InputHash = convert.HashNone
		dst := filepath.Join(t.TempDir(), s.String())
		if _, err := convert.Convert(src, dst, opt); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	cases := []struct {
		name string
		src  string
		ops  Ops
	}{
		{"plain", src, MatMulNBits},
		{"int4-g128-asym/matmulnbits", quantize(quant.Scheme{Bits: 4, GroupSize: 128}), MatMulNBits},
		{"int4-g128-sym/qdq", quantize(quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}), QDQ},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst, r := checkExport(t, c.src, ids[:64], Options{Ops: c.ops})
			t.Logf("%s %d bytes, %s %d bytes, %.2f s", ModelFile, r.ModelBytes, DataFile, r.DataBytes, r.Seconds)
			checkPerplexity(t, c.src, dst, ids)
		})
	}
}
