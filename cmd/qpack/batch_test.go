package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/batch"
	"github.com/qpack-dev/qpack/internal/synth"
	"github.com/qpack-dev/qpack/internal/testenv"
)

const tinyModel = "../../testdata/models/tiny"

func writeJobs(t *testing.T, text string) string {
	t.Helper()
	abs, err := filepath.Abs(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	text = strings.ReplaceAll(text, "TINY", abs)
	text = strings.ReplaceAll(text, "OUT", dir)
	p := filepath.Join(dir, "jobs.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func exitOf(err error) int {
	var e cli.ExitCoder
	if errors.As(err, &e) {
		return e.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// Three jobs on tiny (one failing its gate, one with a bad source): exit 2, the summary and
// the JUnit file name both failures; the keys are convert's and verify's flags.
func TestBatchCommand(t *testing.T) {
	jobs := writeJobs(t, `
jobs:
  - name: int4
    source: TINY
    output: OUT/int4
    scheme: int4-g128-asym
    format: qpack
    verify: {data: TINY/heldout_ids.npy, seq-len: 64, max-seqs: 2, max-ppl: 1000, device: cpu}
  - name: gate
    source: TINY
    output: OUT/gate
    target-bpw: 3
    format: qpack
    override: ['lm_head=keep']
    verify: {data: TINY/heldout_ids.npy, seq-len: 64, max-seqs: 2, max-kl: 0.000001, device: cpu}
  - name: missing
    source: OUT/missing
    output: OUT/missing-q
`)
	dir := filepath.Dir(jobs)
	summary, junit := filepath.Join(dir, "summary.json"), filepath.Join(dir, "junit.xml")
	out, err := run(t, "batch", jobs, "--summary", summary, "--junit", junit)
	if exitOf(err) != 2 {
		t.Fatalf("exit %d (%v), want 2\n%s", exitOf(err), err, out)
	}
	for _, want := range []string{"job gate failed: verification failed: mean KL", "job missing error:", "note: --target-bpw implies --strategy budget"} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q:\n%s", want, out)
		}
	}
	var s batch.Summary
	b, _ := os.ReadFile(summary)
	if err := json.Unmarshal(b, &s); err != nil || len(s.Jobs) != 3 || s.ExitCode != 2 {
		t.Fatalf("summary: %v\n%s", err, b)
	}
	if s.Jobs[0].Status != "passed" || s.Jobs[1].Status != "failed" || s.Jobs[2].Status != "error" || s.Jobs[1].BPW > 3 || s.Jobs[0].Perplexity == 0 {
		t.Errorf("summary:\n%s", b)
	}
	x, _ := os.ReadFile(junit)
	if !strings.Contains(string(x), `<testsuites tests="3" failures="1" errors="1"`) {
		t.Errorf("JUnit:\n%s", x)
	}
	// A rerun skips what is up to date and still applies the gate.
	out, err = run(t, "batch", jobs, "--summary", summary, "-q")
	b, _ = os.ReadFile(summary)
	if exitOf(err) != 2 || !strings.Contains(string(b), `"status": "skipped"`) || strings.Count(string(b), `"up_to_date"`) != 2 {
		t.Errorf("rerun: exit %d\n%s\n%s", exitOf(err), out, b)
	}
}

// An invalid jobs file is refused before any job runs, with exit code 2 (1 is a failed
// threshold) and the file and line of the fault.
func TestBatchJobErrors(t *testing.T) {
	for _, c := range []struct{ jobs, want string }{
		{"- {name: a, source: TINY, output: OUT/a, methd: gptq}", `jobs.yaml:1: job 1 (a): methd: not a flag of convert`},
		{"- {name: a, source: TINY, output: OUT/a, config: x.yaml}", `jobs.yaml:1: job 1 (a): config: not a flag of convert`},
		{"- {name: a, source: TINY, output: OUT/a, verify: {data: x.npy, max-pl: 3}}", `job 1 (a): verify: max-pl: not a flag of verify`},
		{"- {name: a, source: TINY, output: OUT/a, verify: {data: x.npy}}", "job 1 (a): verify: at least one threshold"},
		{"- {name: a, source: TINY, output: OUT/a, export: [onnx2]}", `jobs.yaml:1: job 1 (a): export "onnx2" is not available`},
		{"- {name: a, source: TINY, output: OUT/a, strategy: evolved, target-bpw: 3}", "job 1 (a): --target-bpw needs --strategy budget"},
		{"- {name: a, source: TINY}", "job 1 (a): no output"},
		{"jobs: 3", "jobs.yaml:1: no jobs"},
		// Faults on line 5: a bad indent (the YAML parser itself names line 1), an unknown key,
		// a second job with the first one's output, a key given twice.
		{"jobs:\n  - name: a\n    source: TINY\n    output: OUT/a\n   bits: 4\n", "jobs.yaml:5: invalid YAML"},
		{"jobs:\n  - name: a\n    source: TINY\n    output: OUT/a\n    bogus: 4\n", "jobs.yaml:5: job 1 (a): bogus: not a flag of convert"},
		{"- name: a\n  source: TINY\n  output: OUT/a\n\n- name: b\n  source: TINY\n  output: OUT/a\n", "jobs.yaml:5: job 2 (b): job a writes the same output"},
		{"- name: a\n  source: TINY\n  output: OUT/a\n  bits: 3\n  bits: 4\n", "jobs.yaml:5: job 1: key bits appears twice (lines 4 and 5)"},
	} {
		_, err := run(t, "batch", writeJobs(t, c.jobs))
		if err == nil || !strings.Contains(err.Error(), c.want) || exitOf(err) != 2 {
			t.Errorf("%q: exit %d, %v; want exit 2 and %q", c.jobs, exitOf(err), err, c.want)
		}
	}
}

// SIGTERM during a batch (a real signal to a child process): the job being written leaves no
// output and no staging directory, the finished job stays, and the exit code is 2.
func TestBatchSignal(t *testing.T) {
	if args := os.Getenv("QPACK_BATCH_ARGS"); args != "" { // the child: run the batch
		os.Exit(exitCode(append([]string{"qpack"}, strings.Split(args, "\n")...)))
	}
	if testing.Short() {
		t.Skip("writes a 200 MB checkpoint")
	}
	dir := t.TempDir()
	big := bigModel(t, dir)
	jobs := writeJobs(t, `
- {name: small, source: TINY, output: OUT/out/small}
- {name: big, source: `+big+`, output: OUT/out/big, device: cpu}
- {name: after, source: TINY, output: OUT/out/after}
`)
	outDir := filepath.Join(filepath.Dir(jobs), "out")
	summary := filepath.Join(dir, "summary.json")
	cmd := startWriting(t, "TestBatchSignal", "QPACK_BATCH_ARGS", []string{"batch", jobs, "--summary", summary, "-q"}, nil,
		func() bool { return exists(filepath.Join(outDir, "small")) && testenv.StagingHasShard(outDir) })
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("the interrupted batch exited with %v, want 2", err)
	}
	entries, _ := os.ReadDir(outDir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "small" {
		t.Errorf("after SIGTERM %s holds %v, want only the finished job's small", outDir, names)
	}
	b, _ := os.ReadFile(summary)
	var s batch.Summary
	if err := json.Unmarshal(b, &s); err != nil || len(s.Jobs) != 3 || s.Jobs[0].Status != "passed" ||
		s.Jobs[1].Status != "interrupted" || s.Jobs[2].Status != "interrupted" {
		t.Errorf("summary after SIGTERM: %v\n%s", err, b)
	}
}

// bigModel writes a 200 MB synthetic checkpoint into dir: one whose conversion takes long enough
// to be interrupted while it writes.
func bigModel(t *testing.T, dir string) string {
	big := filepath.Join(dir, "big")
	cfg := synth.Config{Layers: 12, Hidden: 1024, Intermediate: 2816, Heads: 8, KVHeads: 8, Vocab: 8000, MaxShard: 50e6}
	if err := synth.Write(big, cfg); err != nil {
		t.Fatal(err)
	}
	return big
}

// startWriting runs the test named test as a child process running qpack with args (passed in
// the environment variable env), and returns once writing(): the moment to signal it.
func startWriting(t *testing.T, test, env string, args []string, stderr io.Writer, writing func() bool) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), env+"="+strings.Join(args, "\n"))
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !writing() {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the child never started writing shards")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cmd
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// A job's export: [onnx] writes OUTPUT.onnx beside the converted checkpoint.
func TestBatchExportONNX(t *testing.T) {
	jobs := writeJobs(t, `
jobs:
  - {name: int4, source: TINY, output: OUT/int4, device: cpu, export: [onnx]}
`)
	dir := filepath.Dir(jobs)
	if out, err := run(t, "batch", jobs, "-q", "--summary", filepath.Join(dir, "s.json")); err != nil {
		t.Fatalf("batch with an ONNX export: %v\n%s", err, out)
	}
	for _, f := range []string{"int4/model.safetensors", "int4.onnx/model.onnx", "int4.onnx/model.onnx.data"} {
		if !exists(filepath.Join(dir, f)) {
			t.Errorf("the batch did not write %s", f)
		}
	}
}

// SIGINT during a conversion (a real signal to a child process): it says so, exits 130, and
// leaves neither the output nor its staging directory.
func TestConvertSignal(t *testing.T) {
	if args := os.Getenv("QPACK_CONVERT_ARGS"); args != "" { // the child: convert
		os.Exit(exitCode(append([]string{"qpack"}, strings.Split(args, "\n")...)))
	}
	if testing.Short() {
		t.Skip("writes a 200 MB checkpoint")
	}
	dir := t.TempDir()
	big := bigModel(t, dir)
	outDir := filepath.Join(dir, "out")
	var stderr bytes.Buffer
	cmd := startWriting(t, "TestConvertSignal", "QPACK_CONVERT_ARGS", []string{"convert", big, "-o", filepath.Join(outDir, "q"), "--device", "cpu", "-q"},
		&stderr, func() bool { return testenv.StagingHasShard(outDir) })
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Fatalf("the interrupted conversion exited with %v, want 130\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted by SIGINT") {
		t.Errorf("stderr does not say it was interrupted:\n%s", stderr.String())
	}
	if entries, _ := os.ReadDir(outDir); len(entries) != 0 {
		t.Errorf("after SIGINT %s holds %v, want nothing", outDir, entries)
	}
}

// Two machines each run one shard (one by --shard I/N, one by JOB_COMPLETION_INDEX as in a
// Kubernetes Indexed Job); --merge gives the file's summary, JUnit report and exit code.
func TestBatchShardsAndMerge(t *testing.T) {
	jobs := writeJobs(t, `
- {name: a, source: TINY, output: OUT/a, device: cpu}
- {name: b, source: TINY, output: OUT/b, device: cpu}
- {name: c, source: TINY, output: OUT/c, device: cpu}
`)
	dir := filepath.Dir(jobs)
	s0, s1, merged := filepath.Join(dir, "s0.json"), filepath.Join(dir, "s1.json"), filepath.Join(dir, "all.json")
	if out, err := run(t, "batch", jobs, "--shard", "0/2", "--summary", s0, "-q"); err != nil {
		t.Fatalf("shard 0/2: %v\n%s", err, out)
	}
	if !exists(filepath.Join(dir, "a")) || exists(filepath.Join(dir, "b")) || !exists(filepath.Join(dir, "c")) {
		t.Fatal("shard 0/2 did not convert exactly jobs a and c")
	}
	t.Setenv("JOB_COMPLETION_INDEX", "1")
	if out, err := run(t, "batch", jobs, "--shard", "2", "--summary", s1, "-q"); err != nil || !exists(filepath.Join(dir, "b")) {
		t.Fatalf("shard 1 of 2 from JOB_COMPLETION_INDEX: %v\n%s", err, out)
	}
	junit := filepath.Join(dir, "junit.xml")
	if out, err := run(t, "batch", "--merge", s1, s0, "--summary", merged, "--junit", junit); err != nil {
		t.Fatalf("merge: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(merged)
	var s batch.Summary
	if err := json.Unmarshal(b, &s); err != nil || len(s.Jobs) != 3 || s.Jobs[0].Name != "a" || s.Jobs[1].Name != "b" || s.Passed != 3 || s.ExitCode != 0 {
		t.Errorf("merged summary: %v\n%s", err, b)
	}
	if x, _ := os.ReadFile(junit); !strings.Contains(string(x), `tests="3"`) {
		t.Errorf("merged JUnit:\n%s", x)
	}
	if _, err := run(t, "batch", "--merge", s0); exitOf(err) != 2 || !strings.Contains(err.Error(), "shards 1/2 are missing") {
		t.Errorf("merging one of two shards: exit %d, %v", exitOf(err), err)
	}
}
