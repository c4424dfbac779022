package inspect

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/testenv"
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
