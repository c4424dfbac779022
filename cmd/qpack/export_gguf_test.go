package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestExportGGUFAndInspect(t *testing.T) {
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	got, err := run(t, "export", "gguf", "../../testdata/models/tiny", "-o", out, "--type", "q4_0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, "28 Q4_0  quantized") || !strings.Contains(got, "wrote "+out+": 39 tensors") {
		t.Fatalf("export printed:\n%s", got)
	}
	if _, err := run(t, "export", "gguf", "../../testdata/models/tiny", "-o", out); err == nil || !strings.Contains(err.Error(), "--overwrite") {
		t.Fatalf("exporting over an existing file: %v", err)
	}
	got, err = run(t, "inspect", "--json", out)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Metadata map[string]any `json:"metadata"`
		Tensors  []struct {
			Name, Type string
		} `json:"tensors"`
	}
	if err := json.Unmarshal([]byte(got), &r); err != nil || len(r.Tensors) != 39 || r.Metadata["general.file_type"] != 2.0 {
		t.Fatalf("inspect --json: %v, %d tensors, file_type %v", err, len(r.Tensors), r.Metadata["general.file_type"])
	}
	if r.Tensors[2].Name != "blk.0.attn_q.weight" || r.Tensors[2].Type != "Q4_0" {
		t.Fatalf("tensor 2: %+v", r.Tensors[2])
	}
}
