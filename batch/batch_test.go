package batch

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/evaluate"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
)

// tinyJobs: one that passes its gate, one that fails it (perplexity at most 1 cannot hold),
// one whose source does not exist.
func tinyJobs(t *testing.T, out string) []Job {
	tiny := testenv.Testdata(t, "models/tiny")
	opt := convert.DefaultOptions()
	opt.Device, opt.Version = convert.DeviceCPU, "test"
	verify := func(maxPPL float64) *Verify {
		return &Verify{Eval: evaluate.Options{Data: filepath.Join(tiny, "heldout_ids.npy"), SeqLen: 64, MaxSeqs: 2, Device: "cpu"},
			Thresholds: evaluate.Thresholds{MaxPerplexity: maxPPL}}
	}
	return []Job{
		{Name: "good", Source: tiny, Output: filepath.Join(out, "good"), Options: opt, Verify: verify(1000)},
		{Name: "gate", Source: tiny, Output: filepath.Join(out, "gate"), Options: opt, Verify: verify(1)},
		{Name: "bad-source", Source: filepath.Join(out, "no-such-model"), Output: filepath.Join(out, "bad"), Options: opt},
	}
}

func statuses(s *Summary) string {
	var st []string
	for _, r := range s.Jobs {
		st = append(st, r.Status)
	}
	return strings.Join(st, " ")
}

func TestBatch(t *testing.T) {
	out := t.TempDir()
	jobs := tinyJobs(t, out)
	var log bytes.Buffer
	s, err := Run(jobs, Options{Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(s); got != "passed failed error" || s.ExitCode != 2 {
		t.Fatalf("statuses %q, exit %d; want passed failed error, exit 2\n%s", got, s.ExitCode, log.String())
	}
	good, gate, bad := s.Jobs[0], s.Jobs[1], s.Jobs[2]
	if good.Bytes <= 0 || good.BPW < 4 || good.BPW > 5 || good.Perplexity <= 1 || good.MeanKL <= 0 {
		t.Errorf("good job's numbers: %+v", good)
	}
	if !strings.Contains(gate.Error, "perplexity") || gate.Perplexity <= 1 {
		t.Errorf("gate job: %+v", gate)
	}
	if !strings.Contains(bad.Error, "no-such-model") {
		t.Errorf("bad source job's error %q does not name the source", bad.Error)
	}
	if !strings.Contains(log.String(), "job gate: FAILED") || !strings.Contains(log.String(), "job bad-source: ERROR") {
		t.Errorf("log does not name the failures:\n%s", log.String())
	}

	// JUnit: three cases, one failure, one error.
	var x bytes.Buffer
	if err := s.WriteJUnit(&x); err != nil {
		t.Fatal(err)
	}
	var doc junitSuites
	if err := xml.Unmarshal(x.Bytes(), &doc); err != nil {
		t.Fatalf("JUnit XML does not parse: %v\n%s", err, x.String())
	}
	c := doc.Suite.Cases
	if doc.Tests != 3 || doc.Failures != 1 || doc.Errors != 1 || len(c) != 3 || c[0].Failure != nil || c[0].Error != nil ||
		c[1].Failure == nil || !strings.Contains(c[1].Failure.Message, "perplexity") || c[2].Error == nil {
		t.Errorf("JUnit:\n%s", x.String())
	}

	// Without the bad source only the gate fails: exit 1.
	s, err = Run(jobs[:2], Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(s); got != "skipped failed" || s.ExitCode != 1 {
		t.Errorf("rerun of good and gate: %q, exit %d; want skipped failed, exit 1", got, s.ExitCode)
	}
	if s.Jobs[0].UpToDate == "" || s.Jobs[0].Bytes != good.Bytes || s.Jobs[0].BPW != good.BPW || s.Jobs[1].UpToDate == "" {
		t.Errorf("a skipped job's result: %+v", s.Jobs[0])
	}

	// Another scheme, another version or --force: converted again.
	changed := jobs[:1]
	changed[0].Options.Alloc = convert.Uniform(quant.Scheme{Bits: 8, GroupSize: 128, Sym: true})
	if s, _ = Run(changed, Options{}); statuses(s) != "passed" || s.Jobs[0].BPW < 8 {
		t.Errorf("a job with another scheme: %q, %.3f bits/weight", statuses(s), s.Jobs[0].BPW)
	}
	changed[0].Options.Version = "test2"
	if s, _ = Run(changed, Options{}); statuses(s) != "passed" {
		t.Errorf("a job with another version: %q", statuses(s))
	}
	if s, _ = Run(changed, Options{}); statuses(s) != "skipped" {
		t.Errorf("the same job again: %q", statuses(s))
	}
	if s, _ = Run(changed, Options{Force: true}); statuses(s) != "passed" {
		t.Errorf("a forced job: %q", statuses(s))
	}
}

// An existing output qpack did not write is not replaced unless the job says overwrite.
func TestBatchKeepsForeignOutput(t *testing.T) {
	jobs := tinyJobs(t, t.TempDir())[:1]
	jobs[0].Verify = nil
	if err := os.MkdirAll(jobs[0].Output, 0o755); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(jobs[0].Output, "notes.txt")
	if err := os.WriteFile(mine, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Run(jobs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, serr := os.Stat(mine); statuses(s) != "error" || !strings.Contains(s.Jobs[0].Error, "not a checkpoint qpack wrote") || serr != nil {
		t.Errorf("foreign output: %q %q (%v)", statuses(s), s.Jobs[0].Error, serr)
	}
	jobs[0].Options.Overwrite = true
	if s, _ = Run(jobs, Options{}); statuses(s) != "passed" {
		t.Errorf("with overwrite: %q %q", statuses(s), s.Jobs[0].Error)
	}
}

// Jobs at once give the same results as one at a time.
func TestBatchParallel(t *testing.T) {
	out := t.TempDir()
	jobs := tinyJobs(t, out)
	for i := range jobs {
		jobs[i].Verify = nil
	}
	s, err := Run(jobs, Options{Jobs: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(s); got != "passed passed error" || s.ExitCode != 2 {
		t.Errorf("statuses %q, exit %d", got, s.ExitCode)
	}
}

func TestBatchRefusedBeforeRunning(t *testing.T) {
	out := t.TempDir()
	jobs := tinyJobs(t, out)
	jobs[1].Export = []string{"tflite"}
	_, err := Run(jobs, Options{})
	if err == nil || !strings.Contains(err.Error(), "gate") || !strings.Contains(err.Error(), `export "tflite"`) {
		t.Errorf("unknown export: %v", err)
	}
	if _, err := os.Stat(jobs[0].Output); !os.IsNotExist(err) {
		t.Errorf("a job ran before the batch was refused")
	}
	jobs = tinyJobs(t, out)
	jobs[2].Output = jobs[0].Output + "/"
	if _, err := Run(jobs, Options{}); err == nil || !strings.Contains(err.Error(), "same output") {
		t.Errorf("two jobs writing one output: %v", err)
	}
}

// An exporter registered under a kind runs on the job's output after its gate.
func TestBatchExport(t *testing.T) {
	var got []string
	Exporters["test"] = func(ctx context.Context, dir string, log io.Writer) error {
		got = append(got, dir)
		if strings.Contains(dir, "gate") {
			return errors.New("cannot export")
		}
		return nil
	}
	defer delete(Exporters, "test")
	jobs := tinyJobs(t, t.TempDir())[:2]
	jobs[1].Verify = nil
	for i := range jobs {
		jobs[i].Export = []string{"test"}
	}
	s, err := Run(jobs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if statuses(s) != "passed error" || len(got) != 2 || len(s.Jobs[0].Exported) != 1 || !strings.Contains(s.Jobs[1].Error, "export test: cannot export") {
		t.Errorf("exports: %q, called on %v, %+v", statuses(s), got, s.Jobs)
	}
}

// A batch cancelled while a job writes: that job's staging directory is removed, the finished
// job stays, the job not started is reported, and the exit code is 2.
func TestBatchCancelled(t *testing.T) {
	out := t.TempDir()
	jobs := tinyJobs(t, out)[:2]
	jobs = append(jobs, tinyJobs(t, out)[0])
	jobs[2].Name, jobs[2].Output = "later", filepath.Join(out, "later")
	for i := range jobs {
		jobs[i].Verify = nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	jobs[1].Options.Progress = func(done, total int, _, _ int64) { // the second job: stop midway
		if done == total/2 {
			cancel()
		}
	}
	s, err := Run(jobs, Options{Context: ctx})
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(s); got != "passed interrupted interrupted" || s.ExitCode != 2 {
		t.Errorf("statuses %q, exit %d", got, s.ExitCode)
	}
	entries, _ := os.ReadDir(out)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "good" {
		t.Errorf("after the interruption the output directory holds %v, want only good", names)
	}
}

// A GGUF job writes one file, its gate evaluates it, and a second run finds it up to date.
func TestBatchGGUF(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	opt := convert.DefaultOptions()
	opt.Device, opt.Version, opt.Format, opt.GGUF.Preset = convert.DeviceCPU, "test", "gguf", "Q4_K_M"
	job := Job{Name: "gguf", Source: tiny, Output: out, Options: opt,
		Verify: &Verify{Eval: evaluate.Options{Data: filepath.Join(tiny, "heldout_ids.npy"), SeqLen: 64, MaxSeqs: 2, Device: "cpu"},
			Thresholds: evaluate.Thresholds{MaxPerplexity: 1000}}}
	for i, want := range []string{StatusPassed, StatusSkipped} {
		var log bytes.Buffer
		s, err := Run([]Job{job}, Options{Log: &log})
		if err != nil {
			t.Fatal(err)
		}
		r := s.Jobs[0]
		if r.Status != want || r.Bytes <= 0 || r.BPW <= 4 {
			t.Fatalf("run %d: %+v, want %s\n%s", i+1, r, want, log.String())
		}
	}
}
