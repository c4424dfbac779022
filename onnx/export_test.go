package onnx

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/quant"
)

// convertTiny quantizes the tiny model with scheme into format; with actOrder, by GPTQ with
// act-order on its held-out ids (non-trivial g_idx), else by RTN.
func convertTiny(t *testing.T, scheme, format string, actOrder bool) string {
	t.Helper()
	s, err := quant.ParseScheme(scheme)
	if err != nil {
		t.Fatal(err)
	}
	opt := convert.DefaultOptions()
	opt.Alloc = convert.Uniform(s)
	opt.Format = format
	opt.InputHash = convert.HashNone
	if actOrder {
		opt.Method = "gptq"
		opt.GPTQ.ActOrder = true
		opt.Calib = convert.CalibOptions{File: filepath.Join(tinyDir(t), "heldout_ids.npy"), Samples: 4, SeqLen: 128}
	}
	dst := filepath.Join(t.TempDir(), strings.ReplaceAll(scheme, "-", "_"))
	if _, err := convert.Convert(tinyDir(t), dst, opt); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestExportTinyQuantized exports RTN and GPTQ conversions of the tiny model with both kinds of
// ops and checks logits and the KV cache against qpack's own forward pass on the same checkpoint.
func TestExportTinyQuantized(t *testing.T) {
	ids := heldout(t, tinyDir(t), 64)
	cases := []struct {
		scheme, format string
		actOrder       bool
	}{
		{"int4-g128-sym", "gptq", false},
		{"int4-g32-asym", "gptq", false},
		{"int8-g128-sym", "gptq", false},
		{"int8-g64-asym", "compressed-tensors", false},
		{"int2-g64-asym", "gptq", false},
		{"int2-g32-sym", "qpack", false},
		{"int3-g128-asym", "gptq", false},
		{"int6-g64-asym", "qpack", false}, // 8-bit containers
		{"int5-g128-sym", "qpack", false},
		{"int4-pc-asym", "gptq", false},
		{"int4-g32-asym", "gptq", true},
		{"int4-g64-sym", "gptq", true},
	}
	for _, c := range cases {
		src := convertTiny(t, c.scheme, c.format, c.actOrder)
		for _, ops := range []Ops{MatMulNBits, QDQ} {
			name := c.scheme + "/" + c.format + "/" + string(ops)
			if c.actOrder {
				name += "/act-order"
			}
			t.Run(name, func(t *testing.T) {
				dst, r := checkExport(t, src, ids, Options{Ops: ops})
				graph, err := os.ReadFile(filepath.Join(dst, ModelFile))
				if err != nil {
					t.Fatal(err)
				}
				if hasPerm := strings.Contains(string(graph), "q_proj.perm"); hasPerm != c.actOrder {
					t.Errorf("column permutation (act-order Gather) present: %v, want %v", hasPerm, c.actOrder)
				}
				want := map[Ops]string{MatMulNBits: "MatMulNBits", QDQ: "DequantizeLinear"}[ops]
				if r.Linears[want] != 28 || r.Linears["float"] != 1 {
					t.Errorf("linears %v, want 28 %s and lm_head float", r.Linears, want)
				}
				if wantOpset := map[bool]int64{true: 25, false: 21}[ops == QDQ && strings.HasPrefix(c.scheme, "int2")]; r.Opset != wantOpset {
					t.Errorf("opset %d, want %d", r.Opset, wantOpset)
				}
			})
		}
	}
}

// TestExportRefusesUnsupported: NF4, FP8, INT1, k-quants, IQ types and FP4 have no ONNX op; the export names the tensor
// and the nearest scheme and writes nothing, unless asked to write them dequantized.
func TestExportRefusesUnsupported(t *testing.T) {
	ids := heldout(t, tinyDir(t), 64)
	for _, c := range []struct{ scheme, nearest string }{
		{"nf4-g64", "int4-g64-asym"}, {"fp8", "int8-pc-sym"}, {"bin-g128-sym", "int2-g128-asym"},
		{"q4_k", "int4-g32-asym"}, {"q3_k", "int3-g16-sym"}, {"iq4_nl", "int4-g32-sym"},
		{"nvfp4", "int4-g16-sym"}, {"mxfp4", "int4-g32-sym"},
		{"fp8-b128", "int8-pc-sym"},
	} {
		t.Run(c.scheme, func(t *testing.T) {
			src := convertTiny(t, c.scheme, "qpack", false)
			dst := filepath.Join(t.TempDir(), "onnx")
			for _, ops := range []Ops{MatMulNBits, QDQ} {
				_, err := Export(src, dst, Options{Ops: ops})
				if err == nil || !strings.Contains(err.Error(), "tensors model.layers.0.") || !strings.Contains(err.Error(), c.nearest) {
					t.Fatalf("%s: error %v, want one naming a tensor and %s", ops, err, c.nearest)
				}
				if _, err := os.Stat(dst); !os.IsNotExist(err) {
					t.Fatalf("%s: refused export left %s behind", ops, dst)
				}
				entries, _ := os.ReadDir(filepath.Dir(dst))
				if len(entries) != 0 {
					t.Fatalf("refused export left %v", entries)
				}
			}
			_, r := checkExport(t, src, ids, Options{DequantizeUnsupported: true})
			if len(r.Dequantized) != 28 || r.Linears["dequantized"] != 28 {
				t.Errorf("dequantized %d modules (%v), want 28", len(r.Dequantized), r.Linears)
			}
		})
	}
}

// TestExportOddGroups: groups that are no MatMulNBits block (24 columns, the last one partial)
// are refused for MatMulNBits, naming qdq, and exported exactly with qdq.
func TestExportOddGroups(t *testing.T) {
	src := convertTiny(t, "int4-g24-asym", "gptq", false)
	_, err := Export(src, filepath.Join(t.TempDir(), "onnx"), Options{})
	if err == nil || !strings.Contains(err.Error(), "--onnx-ops qdq") || !strings.Contains(err.Error(), "tensors model.layers.") {
		t.Fatalf("MatMulNBits export of 24-column groups: %v, want a refusal naming the tensor and --onnx-ops qdq", err)
	}
	checkExport(t, src, heldout(t, tinyDir(t), 64), Options{Ops: QDQ})
}

// TestExportDefaultOptimizationLevel runs exports at onnxruntime's default level ("all"), where
// it fuses and rewrites the graph: MatMulNBits exports stay within 1e-3; qdq ones within 5e-2,
// since DQ→MatMul becomes MatMulNBits with int8 activations there (≈ 2% on tiny's logits, by
// design, docs/reference/onnx.md §1.5; the README says to run qdq exports at level basic).
func TestExportDefaultOptimizationLevel(t *testing.T) {
	ids := heldout(t, tinyDir(t), 64)
	src := convertTiny(t, "int4-g128-sym", "gptq", false)
	want := qpackLogits(t, src, ids)
	for _, ops := range []Ops{MatMulNBits, QDQ} {
		dst := filepath.Join(t.TempDir(), string(ops))
		if _, err := Export(src, dst, Options{Ops: ops}); err != nil {
			t.Fatal(err)
		}
		raw := runORT(t, dst, map[string]any{"mode": "logits", "ids": ids, "level": "all"})
		got := make([]float32, len(raw)/4)
		for i := range got {
			got[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		tol := map[Ops]float64{MatMulNBits: 1e-3, QDQ: 5e-2}[ops]
		if e := relErr(t, got, want); e > tol {
			t.Errorf("%s at level all: max|Δ|/max|logit| = %.2e, want ≤ %g", ops, e, tol)
		} else {
			t.Logf("%s at level all: %.2e", ops, e)
		}
	}
}
