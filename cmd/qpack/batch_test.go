package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/batch"
	"github.com/qpack-dev/qpack/internal/synth"
)

func writeJobs(t *testing.T, dir, yaml string) string {
	t.Helper()
	p := filepath.Join(dir, "jobs.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func readSummary(t *testing.T, path string) batch.Summary {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s batch.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// The jobs file: defaults, convert's flags as keys, paths relative to the file, a verify map;
// exit code 1 when only a threshold fails, 0 on the rerun that passes, and the JUnit file.
func TestBatchCommand(t *testing.T) {
	dir := t.TempDir()
	tiny, err := filepath.Abs("../../testdata/models/tiny")
	if err != nil {
		t.Fatal(err)
	}
	jobs := writeJobs(t, dir, `
defaults:
  format: qpack
  device: cpu
jobs:
  - name: int4
    source: `+tiny+`
    output: out/int4
    bits: 4
    asym: true
    override: ['mlp\.down_proj=int8-g128-asym']
    verify: {data: `+tiny+`/heldout_ids.npy, max-seqs: 2, reference: `+tiny+`, max-kl: 0.000001}
`)
	sum, junit := filepath.Join(dir, "summary.json"), filepath.Join(dir, "junit.xml")
	_, err = run(t, "batch", jobs, "-q", "--summary", sum, "--junit", junit)
	var e exitError
	if !errors.As(err, &e) || e.code != batch.ExitVerifyFailed {
		t.Fatalf("a failed threshold gave %v, want exit code %d", err, batch.ExitVerifyFailed)
	}
	s := readSummary(t, sum)
	if s.Jobs[0].Status != batch.StatusVerifyFailed || s.Jobs[0].Output != filepath.Join(dir, "out/int4") {
		t.Fatalf("summary %+v", s.Jobs[0])
	}
	if b, err := os.ReadFile(junit); err != nil || !strings.Contains(string(b), `<failure message="verification failed: mean KL`) {
		t.Errorf("JUnit: %v\n%s", err, b)
	}
	inspect, err := run(t, "inspect", filepath.Join(dir, "out/int4"))
	if err != nil || !strings.Contains(inspect, "int8-g128-asym") || !strings.Contains(inspect, "int4-g128-asym") {
		t.Errorf("the job's keys did not reach the conversion (scheme, override): %v\n%s", err, inspect)
	}

	relaxed := strings.Replace(string(mustRead(t, jobs)), "max-kl: 0.000001", "max-kl: 10", 1)
	writeJobs(t, dir, relaxed)
	if _, err := run(t, "batch", jobs, "-q", "--summary", sum); err != nil {
		t.Fatalf("the relaxed rerun: %v", err)
	}
	if s := readSummary(t, sum); s.Jobs[0].Status != batch.StatusSkipped || s.ExitCode != 0 {
		t.Errorf("the relaxed rerun: %s, exit %d; want skipped (the output is up to date) and 0", s.Jobs[0].Status, s.ExitCode)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Mistakes in a jobs file are refused before anything runs, naming the job and the key.
func TestBatchJobsFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ yaml, want string }{
		{"jobs:\n  - {name: a, source: s, output: o, bitz: 4}\n", `job a: unknown key "bitz"`},
		{"jobs:\n  - {name: a, source: s, output: o, report: r.json}\n", `job a: unknown key "report"`},
		{"jobs:\n  - {name: a, source: s}\n", "job a: needs a source and an output"},
		{"jobs:\n  - {name: a, source: s, output: o, verify: {data: d, max-kll: 1}}\n", `job a: verify: unknown key "max-kll"`},
		{"jobs:\n  - {name: a, source: s, output: o, verify: {data: d}}\n", "job a: verify needs at least one threshold"},
		{"jobs:\n  - {name: a, source: s, output: o, bits: many}\n", "job a: "},
		{"jobs: []\n", "no jobs"},
	} {
		_, err := run(t, "batch", writeJobs(t, dir, tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.yaml, err, tc.want)
		}
		var e exitError
		if errors.As(err, &e) {
			t.Errorf("%q: a jobs file error should exit 1 like other usage errors, not %d", tc.yaml, e.code)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("refused batches wrote %d entries besides the jobs file", len(entries)-1)
	}
}

// SIGINT during a batch: the finished job stays, the running one's temporary output is removed,
// nothing after it runs, the summary says so, and the exit code is 2.
func TestBatchInterrupted(t *testing.T) {
	if jobs := os.Getenv("QPACK_BATCH_JOBS"); jobs != "" { // the child: run the batch
		app := newApp()
		err := app.Run([]string{"qpack", "batch", "-q", "--summary", os.Getenv("QPACK_BATCH_SUMMARY"), jobs})
		var e exitError
		if errors.As(err, &e) {
			os.Exit(e.code)
		}
		if err != nil {
			os.Exit(1)
		}
		return
	}
	if testing.Short() {
		t.Skip("writes a 200 MB checkpoint")
	}
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	cfg := synth.Config{Layers: 8, Hidden: 1024, Intermediate: 2816, Heads: 8, KVHeads: 8, Vocab: 8000, MaxShard: 50e6}
	if err := synth.Write(big, cfg); err != nil {
		t.Fatal(err)
	}
	tiny, _ := filepath.Abs("../../testdata/models/tiny")
	jobs := writeJobs(t, dir, `
defaults: {device: cpu, format: qpack}
jobs:
  - {name: first, source: `+tiny+`, output: out/first}
  - {name: big, source: big, output: out/big}
  - {name: after, source: `+tiny+`, output: out/after}
`)
	sum := filepath.Join(dir, "summary.json")
	cmd := exec.Command(os.Args[0], "-test.run=^TestBatchInterrupted$")
	cmd.Env = append(os.Environ(), "QPACK_BATCH_JOBS="+jobs, "QPACK_BATCH_SUMMARY="+sum)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(120 * time.Second)
	first := filepath.Join(dir, "out/first")
	for !exists(first) || !stagingHasShard(filepath.Join(dir, "out")) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the big job never started writing")
		}
		time.Sleep(2 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != batch.ExitJobFailed {
		t.Fatalf("interrupted batch: %v, want exit code %d", err, batch.ExitJobFailed)
	}
	s := readSummary(t, sum)
	if got := []string{s.Jobs[0].Status, s.Jobs[1].Status, s.Jobs[2].Status}; got[0] != batch.StatusPassed ||
		got[1] != batch.StatusInterrupted || got[2] != batch.StatusNotRun {
		t.Fatalf("statuses %v, want passed, interrupted, not-run", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "out/first/model.safetensors")); err != nil {
		t.Errorf("the finished job's output is gone: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "out"))
	for _, e := range entries {
		if e.Name() != "first" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// stagingHasShard reports whether a hidden staging directory in parent holds a shard being
// written (a temporary file).
func stagingHasShard(parent string) bool {
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		files, _ := os.ReadDir(filepath.Join(parent, e.Name()))
		for _, f := range files {
			if strings.Contains(f.Name(), ".safetensors.tmp-") {
				return true
			}
		}
	}
	return false
}
