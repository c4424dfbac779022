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
		Metadata map[string]string `json:"metadata"`
		Tensors  []struct {
			Name, DType string
			Shape       []int
		} `json:"tensors"`
		Quantization struct {
			BlockBPW float64 `json:"block_bpw"`
		} `json:"quantization"`
	}
	if err := json.Unmarshal([]byte(got), &r); err != nil || len(r.Tensors) != 39 || r.Metadata["general.file_type"] != "2" {
		t.Fatalf("inspect --json: %v, %d tensors, file_type %v", err, len(r.Tensors), r.Metadata["general.file_type"])
	}
	if q := r.Tensors[2]; q.Name != "blk.0.attn_q.weight" || q.DType != "Q4_0" || len(q.Shape) != 2 || q.Shape[0] != 128 {
		t.Fatalf("tensor 2: %+v", r.Tensors[2])
	}
	if r.Quantization.BlockBPW != 4.5 {
		t.Fatalf("decoder blocks at %v bits/weight, want 4.5", r.Quantization.BlockBPW)
	}
}

// convert --format gguf writes one file that inspect, eval (text data, through the file's own
// tokenizer) and dequantize read; --preset and a scheme contradict each other.
func TestConvertGGUFCommand(t *testing.T) {
	tiny := "../../testdata/models/tiny"
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	got, err := run(t, "convert", tiny, "-o", out, "--format", "gguf", "--preset", "Q5_K_M", "--output-type", "q8_0", "-q")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, "wrote "+out) {
		t.Fatalf("convert printed:\n%s", got)
	}
	got, err = run(t, "inspect", out)
	if err != nil || !strings.Contains(got, "qpack.provenance") || !strings.Contains(got, "general.file_type: 17") {
		t.Fatalf("inspect: %v\n%s", err, got)
	}
	got, err = run(t, "eval", out, "--data", tiny+"/heldout.txt", "--max-seqs", "1", "-q")
	if err != nil || !strings.Contains(got, "perplexity") {
		t.Fatalf("eval: %v\n%s", err, got)
	}
	if _, err := run(t, "convert", tiny, "-o", out+"2", "--format", "gguf", "--preset", "Q4_K_M", "--scheme", "q4_k"); err == nil || !strings.Contains(err.Error(), "--scheme") {
		t.Fatalf("--preset with --scheme: %v", err)
	}
}
