package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/internal/timeline"
	"github.com/qpack-dev/qpack/safetensors"
)

// run executes the CLI in-process and returns stdout.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	app.ErrWriter = &out
	err := app.Run(flagsFirst(app, append([]string{"qpack"}, args...)))
	return out.String(), err
}

func TestInspectCommand(t *testing.T) {
	out, err := run(t, "inspect", "--json", "../../testdata/models/tiny")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Tensors     []any `json:"tensors"`
		TotalParams int64 `json:"total_params"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Tensors) != 39 {
		t.Fatalf("inspect --json: %v, %d tensors", err, len(r.Tensors))
	}
	if _, err := run(t, "inspect", "/does/not/exist"); err == nil {
		t.Errorf("inspect of a missing path should fail")
	}
	if _, err := run(t, "inspect"); err == nil {
		t.Errorf("inspect without arguments should fail")
	}
}

func TestHelpEverywhere(t *testing.T) {
	app := newApp()
	for _, c := range app.Commands {
		out, err := run(t, c.Name, "--help")
		if err != nil || !strings.Contains(out, c.Name) {
			t.Errorf("%s --help: %v\n%s", c.Name, err, out)
		}
	}
	out, _ := run(t, "--version")
	if !strings.Contains(out, "qpack version") {
		t.Errorf("--version printed %q", out)
	}
}

func TestConvertPlanReplayDequantize(t *testing.T) {
	dir := t.TempDir()
	tiny := "../../testdata/models/tiny"
	planJSON, err := run(t, "plan", tiny, "--strategy", "budget", "--target-bpw", "3.5", "--format", "qpack", "--json", "-q")
	if err != nil {
		t.Fatal(err)
	}
	planPath := dir + "/plan.json"
	if err := os.WriteFile(planPath, []byte(planJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "convert", tiny, "-o", dir+"/a", "--strategy", "budget", "--target-bpw", "3.5", "--format", "qpack", "-q", "--report", dir+"/a.json"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "convert", tiny, "--plan", planPath, "-o", dir+"/b", "--format", "qpack", "-q"); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(dir + "/a/model.safetensors")
	b, _ := os.ReadFile(dir + "/b/model.safetensors")
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("replaying the saved plan did not reproduce the conversion byte for byte")
	}
	var rep struct {
		QuantBPW float64 `json:"quantized_bpw"`
	}
	raw, _ := os.ReadFile(dir + "/a.json")
	if err := json.Unmarshal(raw, &rep); err != nil || rep.QuantBPW > 3.5 || rep.QuantBPW < 3 {
		t.Errorf("report bpw %v (%v)", rep.QuantBPW, err)
	}
	if _, err := run(t, "dequantize", dir+"/a", "-o", dir+"/dq", "--dtype", "bf16"); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "inspect", dir+"/dq")
	if err != nil || !strings.Contains(out, "BF16") {
		t.Errorf("inspect of the dequantized output: %v\n%s", err, out)
	}
	if _, err := run(t, "convert", tiny, "-o", dir+"/c", "--sym", "--asym"); err == nil {
		t.Errorf("--sym with --asym should fail")
	}
	if _, err := run(t, "convert", tiny, "-o", dir+"/c", "--format", "qpack", "--target-bpw", "1.5"); err == nil || !strings.Contains(err.Error(), "minimum achievable") {
		t.Errorf("an infeasible budget should fail naming the minimum bpw, got %v", err)
	}
}

// A config file says what flags say; the command line wins, and override lists merge.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfg := dir + "/qpack.yaml"
	os.WriteFile(cfg, []byte("format: qpack\nscheme: int3-g128-asym\noverride:\n  - 'layers\\.0\\.=keep'\n"), 0o644)
	out, err := run(t, "plan", "../../testdata/models/tiny", "--config", cfg, "--override", `down_proj=int8-g128-sym`, "--json", "-q")
	if err != nil {
		t.Fatal(err)
	}
	var plan struct {
		Overrides []string `json:"overrides"`
		Entries   []struct {
			Name, Scheme string
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"model.layers.0.self_attn.q_proj.weight": "keep",          // from the file
		"model.layers.1.mlp.down_proj.weight":    "int8-g128-sym", // command line, listed first
		"model.layers.1.mlp.up_proj.weight":      "int3-g128-asym",
	}
	for _, e := range plan.Entries {
		if w, ok := want[e.Name]; ok && e.Scheme != w {
			t.Errorf("%s: %s, want %s", e.Name, e.Scheme, w)
		}
	}
	if len(plan.Overrides) != 2 || !strings.HasPrefix(plan.Overrides[0], "down_proj") {
		t.Errorf("overrides %v: want the command line's first, then the file's", plan.Overrides)
	}
	os.WriteFile(cfg, []byte("no-such-flag: 1\n"), 0o644)
	if _, err := run(t, "plan", "../../testdata/models/tiny", "--config", cfg); err == nil || !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("an unknown key should be an error naming it, got %v", err)
	}
	// The command line wins over the file for single-valued flags.
	os.WriteFile(cfg, []byte("format: awq\n"), 0o644)
	if _, err := run(t, "plan", "../../testdata/models/tiny", "--config", cfg, "--format", "qpack", "--scheme", "int3-g128-sym"); err != nil {
		t.Errorf("--format on the command line should override the file's awq: %v", err)
	}
}

// --target-bpw without --strategy implies the budget strategy (with a note); with another
// strategy named it is refused.
func TestTargetBPWImpliesBudget(t *testing.T) {
	tiny := "../../testdata/models/tiny"
	out, err := run(t, "plan", tiny, "--target-bpw", "3.5", "--format", "qpack")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "note: --target-bpw implies --strategy budget") || !strings.Contains(out, "budget plan:") {
		t.Errorf("plan --target-bpw without --strategy:\n%s", out)
	}
	_, err = run(t, "plan", tiny, "--target-size", "3MB", "--strategy", "uniform")
	if err == nil || !strings.Contains(err.Error(), "--target-size needs --strategy budget") {
		t.Errorf("plan --target-size --strategy uniform: %v, want a refusal", err)
	}
}

// A budget plan in format qpack defaults to alloc.QPackLadder (NF4 and k-quant rungs included;
// no k-quants under --clip, which they lack, nor under --act-order without --static-groups, nor
// NF4 under AWQ); in format gptq, which holds one scheme, a budget over several is refused.
func TestBudgetDefaultLadder(t *testing.T) {
	tiny := "../../testdata/models/tiny"
	gptq := []string{"--method", "gptq", "--calib", tiny + "/heldout.txt", "--calib-samples", "4", "--calib-seqlen", "64", "--output-probe=false"}
	for _, c := range []struct {
		flags         []string
		want, notWant string
	}{
		{[]string{"--format", "qpack"}, `"q3_k"`, ""},
		{[]string{"--format", "qpack"}, `"nf4-g128"`, ""},
		{[]string{"--format", "qpack", "--clip"}, `"nf4-g128"`, `"q3_k"`},
		{append([]string{"--format", "qpack", "--act-order"}, gptq...), `"nf4-g128"`, `"q3_k"`},
		{append([]string{"--format", "qpack", "--act-order", "--static-groups"}, gptq...), `"q3_k"`, ""},
		{[]string{"--format", "qpack", "--method", "awq", "--calib", tiny + "/heldout.txt", "--calib-samples", "4", "--calib-seqlen", "64", "--output-probe=false"}, `"int4-g128-asym"`, `"nf4`},
	} {
		out, err := run(t, append([]string{"plan", tiny, "--target-bpw", "4", "--json", "-q"}, c.flags...)...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, c.want) || c.notWant != "" && strings.Contains(out, c.notWant) {
			t.Errorf("%v budget plan: want %s listed and %s not:\n%.400s", c.flags, c.want, c.notWant, out)
		}
	}
	if _, err := run(t, "plan", tiny, "--target-bpw", "4", "--format", "gptq"); err == nil || !strings.Contains(err.Error(), "--format qpack") {
		t.Errorf("a budget plan in format gptq: %v", err)
	}
}

func TestExportONNXCommand(t *testing.T) {
	dir := t.TempDir() + "/onnx"
	out, err := run(t, "export", "onnx", "../../testdata/models/tiny", "-o", dir, "--onnx-ops", "qdq")
	if err != nil || !strings.Contains(out, "wrote "+dir) {
		t.Fatalf("export onnx: %v\n%s", err, out)
	}
	for _, f := range []string{"model.onnx", "model.onnx.data", "config.json", "tokenizer.json"} {
		if _, err := os.Stat(dir + "/" + f); err != nil {
			t.Errorf("export onnx did not write %s: %v", f, err)
		}
	}
	if _, err := run(t, "export", "onnx", "../../testdata/models/tiny", "-o", dir); err == nil || !strings.Contains(err.Error(), "--overwrite") {
		t.Errorf("export onnx over an existing directory: %v, want a refusal naming --overwrite", err)
	}
	if _, err := run(t, "export", "onnx", "../../testdata/models/tiny", "-o", dir, "--overwrite", "--onnx-ops", "tflite"); err == nil {
		t.Errorf("export onnx --onnx-ops tflite should fail")
	}
}

// Under --method awq+gptq the importance-weighted group fit is on unless --imatrix=false says
// otherwise (it stands in for AWQ's clipping search); under gptq it is off unless asked for. The
// output's provenance records which.
func TestAWQGPTQImatrixDefault(t *testing.T) {
	tiny := "../../testdata/models/tiny"
	for _, c := range []struct {
		flags []string
		want  bool
	}{
		{[]string{"--method", "awq+gptq"}, true},
		{[]string{"--method", "awq+gptq", "--imatrix=false"}, false},
		{[]string{"--method", "gptq"}, false},
		{[]string{"--method", "gptq", "--imatrix"}, true},
	} {
		out := filepath.Join(t.TempDir(), "q")
		args := append([]string{"convert", tiny, "-o", out, "-q", "--device", "cpu", "--bits", "4", "--format", "qpack",
			"--calib", tiny + "/heldout.txt", "--calib-samples", "2", "--calib-seqlen", "64"}, c.flags...)
		if _, err := run(t, args...); err != nil {
			t.Fatalf("%v: %v", c.flags, err)
		}
		ck, err := safetensors.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		var prov convert.Provenance
		err = json.Unmarshal([]byte(ck.Metadata()[convert.ProvenanceKey]), &prov)
		ck.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := prov.Options["imatrix"]; got != c.want {
			t.Errorf("%v: provenance imatrix %v, want %v", c.flags, got, c.want)
		}
	}
}

// TestDoctorReportsCPUPath: doctor's CPU lines name the matrix engine and kernel, say whether
// OpenBLAS was found, and measure a positive GFLOP/s.
func TestDoctorReportsCPUPath(t *testing.T) {
	var b bytes.Buffer
	describeCPUPath(&b)
	out := b.String()
	for _, want := range []string{"CPU matrix products: ", " kernel, ", " threads (", "OpenBLAS: ", "CPU matrix speed: "} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	var gflops float64
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "CPU matrix speed: "); ok {
			if _, err := fmt.Sscanf(rest, "%g GFLOP/s", &gflops); err != nil || !(gflops > 0) {
				t.Errorf("speed line %q: %v", line, err)
			}
		}
	}
}

// TestTraceFlag: `qpack --trace FILE convert …` writes a trace-event file with the conversion's
// phases — the plan, the method's setup, each block's solves — on the host's row.
func TestTraceFlag(t *testing.T) {
	tiny := "../../testdata/models/tiny"
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.json")
	_, err := run(t, "--trace", trace, "convert", tiny, "-o", filepath.Join(dir, "q"), "-q", "--device", "cpu", "--method", "gptq",
		"--calib", tiny+"/heldout.txt", "--calib-samples", "2", "--calib-seqlen", "64")
	if err != nil {
		t.Fatal(err)
	}
	spans, err := timeline.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, sp := range spans {
		seen[sp.Name] = sp.Lane == "host"
	}
	for _, want := range []string{"plan", "set up the method", "quantize and write", "solve block 0 [qkv]", "solve block 1 [down]"} {
		if !seen[want] {
			t.Errorf("no %q span on the host's row; spans: %v", want, seen)
		}
	}
}
