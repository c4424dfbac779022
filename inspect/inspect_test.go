package inspect

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

func TestInspectTiny(t *testing.T) {
	r, err := Inspect("../testdata/models/tiny")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tensors) != 39 || r.ByDType["F32"].Tensors != 39 || r.TotalParams != 1_311_872 {
		t.Fatalf("got %d tensors, by dtype %v, %d params", len(r.Tensors), r.ByDType, r.TotalParams)
	}
	if r.Architecture != "LlamaForCausalLM" || r.ModelType != "llama" {
		t.Errorf("architecture %q / %q", r.Architecture, r.ModelType)
	}
	var text, js bytes.Buffer
	r.WriteText(&text)
	for _, want := range []string{"model.layers.3.mlp.down_proj.weight", "[128, 384]", "39 tensors, 1,311,872 parameters", "format: pt"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q", want)
		}
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.TotalBytes != r.TotalBytes || len(back.Tensors) != 39 {
		t.Errorf("JSON round trip: %v", err)
	}
}

func TestInspectSmallLlama(t *testing.T) {
	dir := testenv.Shared(t, "models/small-llama")
	r, err := Inspect(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Tensors) != 57 || r.ByDType["BF16"].Tensors != 57 || r.TotalParams != 12_587_904 || len(r.Files) != 5 {
		t.Fatalf("got %d tensors, %v, %d params, files %v", len(r.Tensors), r.ByDType, r.TotalParams, r.Files)
	}
}

func TestInspectBadInput(t *testing.T) {
	p := t.TempDir() + "/bad.safetensors"
	os.WriteFile(p, []byte("garbage!garbage"), 0o644)
	if _, err := Inspect(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("want an error naming %s, got %v", p, err)
	}
}

// Every output layout inspects with its modules' schemes and exact bits per weight.
func TestInspectQuantizedOutputs(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	for _, c := range []struct{ format, scheme string }{
		{"gptq", "int4-g128-asym"}, {"awq", "int4-g64-asym"}, {"compressed-tensors", "int8-g128-sym"}, {"qpack", "nf4-g64"},
		{"qpack", "q2_k"}, {"qpack", "q5_k"},
	} {
		s, err := quant.ParseScheme(c.scheme)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), c.format)
		opt := convert.DefaultOptions()
		opt.Format, opt.Alloc = c.format, convert.Uniform(s)
		rep, err := convert.Convert(tiny, dst, opt)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Inspect(dst)
		if err != nil {
			t.Fatal(err)
		}
		q := r.Quantization
		if q == nil || q.Format != c.format || len(q.Modules) != 28 {
			t.Fatalf("%s: quantization summary %+v", c.format, q)
		}
		f, _ := packing.Lookup(c.format)
		for _, m := range q.Modules {
			want := f.Bytes(s, m.Shape[0], m.Shape[1])
			if m.Scheme != c.scheme || m.Bytes != want {
				t.Errorf("%s %s: %s, %d bytes; want %s, %d", c.format, m.Name, m.Scheme, m.Bytes, c.scheme, want)
			}
		}
		if q.ModelParams != 1_311_872 || math.Abs(q.BPW-rep.QuantBPW) > 1e-9 || q.Compression <= 1 {
			t.Errorf("%s: model params %d, bpw %v (report %v), compression %v", c.format, q.ModelParams, q.BPW, rep.QuantBPW, q.Compression)
		}
	}
}

// A config.json that is not JSON is an error naming it, not a report without an architecture.
func TestInspectRefusesMalformedConfig(t *testing.T) {
	dir := t.TempDir()
	tiny := "../testdata/models/tiny"
	b, err := os.ReadFile(filepath.Join(tiny, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "model.safetensors"), b, 0o644)
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type": "llama",`), 0o644)
	if _, err := Inspect(dir); err == nil || !strings.Contains(err.Error(), "config.json: invalid JSON") {
		t.Fatalf("got %v, want an error naming config.json", err)
	}
	os.Remove(filepath.Join(dir, "config.json"))
	if _, err := Inspect(dir); err != nil {
		t.Fatalf("a checkpoint without config.json: %v", err)
	}
}
