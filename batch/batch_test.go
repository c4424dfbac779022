package batch

import (
	"bytes"
	"context"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/evaluate"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
)

// tinyJob converts the bundled tiny model to s in the qpack format, on the CPU.
func tinyJob(t *testing.T, name, out string, s quant.Scheme) Job {
	opt := convert.DefaultOptions()
	opt.Format, opt.Device, opt.Alloc = "qpack", convert.DeviceCPU, convert.Uniform(s)
	return Job{Name: name, Source: testenv.Testdata(t, "models/tiny"), Output: out, Options: opt}
}

func tinyVerify(t *testing.T, th evaluate.Thresholds) *Verify {
	tiny := testenv.Testdata(t, "models/tiny")
	return &Verify{Eval: evaluate.Options{Data: filepath.Join(tiny, "heldout_ids.npy"), MaxSeqs: 2, Reference: tiny, Device: "cpu"},
		Thresholds: th}
}

func statuses(s *Summary) []string {
	var out []string
	for _, r := range s.Jobs {
		out = append(out, r.Status)
	}
	return out
}

// Three jobs on tiny — one passes its verification, one fails it, one has a bad source — give
// exit code 2, the statuses, bytes and bits per weight in the summary, and JUnit with one
// failure and one error. A rerun skips the finished outputs but verifies them again; --force
// redoes them; a changed option redoes the job and says why.
func TestBatchThreeJobs(t *testing.T) {
	dir := t.TempDir()
	int4 := quant.Scheme{Bits: 4, GroupSize: 128}
	good := tinyJob(t, "int4", filepath.Join(dir, "int4"), int4)
	good.Verify = tinyVerify(t, evaluate.Thresholds{MaxPerplexityIncrease: 0.5})
	strict := tinyJob(t, "int2-strict", filepath.Join(dir, "int2"), quant.Scheme{Bits: 2, GroupSize: 64})
	strict.Verify = tinyVerify(t, evaluate.Thresholds{MaxKL: 1e-4})
	bad := tinyJob(t, "bad-source", filepath.Join(dir, "bad"), int4)
	bad.Source = filepath.Join(dir, "no-such-model")
	jobs := []Job{good, strict, bad}

	s, err := Run(context.Background(), jobs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{StatusPassed, StatusVerifyFailed, StatusFailed}; strings.Join(statuses(s), ",") != strings.Join(want, ",") {
		t.Fatalf("statuses %v, want %v", statuses(s), want)
	}
	if s.ExitCode != ExitJobFailed {
		t.Errorf("exit code %d, want %d", s.ExitCode, ExitJobFailed)
	}
	r := s.Jobs[0]
	if r.Bytes <= 0 || r.BPW < 4 || r.BPW > 4.5 || r.Verify == nil || r.Verify.Perplexity <= 0 {
		t.Errorf("passed job's summary %+v lacks its size, bits per weight or perplexity", r)
	}
	if !strings.Contains(s.Jobs[1].Error, "mean KL") || !strings.Contains(s.Jobs[2].Error, "no-such-model") {
		t.Errorf("errors do not say what failed: %q, %q", s.Jobs[1].Error, s.Jobs[2].Error)
	}
	if _, err := os.Stat(bad.Output); !os.IsNotExist(err) {
		t.Errorf("the failed job left %s (%v)", bad.Output, err)
	}
	checkJUnit(t, s, 3, 1, 1)

	again, err := Run(context.Background(), jobs[:2], Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(again); got[0] != StatusSkipped || got[1] != StatusVerifyFailed {
		t.Fatalf("rerun statuses %v, want skipped and verify-failed (verification runs again)", got)
	}
	if again.ExitCode != ExitVerifyFailed || again.Jobs[0].Bytes != r.Bytes || again.Jobs[0].Verify == nil {
		t.Errorf("rerun: exit %d, summary %+v", again.ExitCode, again.Jobs[0])
	}

	forced, err := Run(context.Background(), jobs[:1], Options{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if forced.Jobs[0].Status != StatusPassed || forced.ExitCode != ExitOK {
		t.Errorf("--force: %v, exit %d", statuses(forced), forced.ExitCode)
	}

	changed := jobs[0]
	changed.Options.Alloc = convert.Uniform(quant.Scheme{Bits: 4, GroupSize: 64})
	redo, err := Run(context.Background(), []Job{changed}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if redo.Jobs[0].Status != StatusPassed || !strings.Contains(redo.Jobs[0].Reason, "plan") {
		t.Errorf("a job with another scheme: %s (%s), want it redone because the plan differs", redo.Jobs[0].Status, redo.Jobs[0].Reason)
	}
}

func checkJUnit(t *testing.T, s *Summary, tests, failures, errors int) {
	t.Helper()
	var buf bytes.Buffer
	if err := s.WriteJUnit(&buf); err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Errors   int `xml:"errors,attr"`
			Cases    []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
				Error   *struct{} `xml:"error"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(buf.Bytes(), &parsed); err != nil {
		t.Fatalf("JUnit does not parse: %v\n%s", err, buf.String())
	}
	su := parsed.Suites[0]
	if su.Tests != tests || su.Failures != failures || su.Errors != errors || len(su.Cases) != tests {
		t.Fatalf("JUnit counts tests %d failures %d errors %d cases %d, want %d %d %d\n%s",
			su.Tests, su.Failures, su.Errors, len(su.Cases), tests, failures, errors, buf.String())
	}
	for i, c := range su.Cases {
		st := s.Jobs[i].Status
		if c.Name != s.Jobs[i].Name || (c.Failure != nil) != (st == StatusVerifyFailed) || (c.Error != nil) != (st == StatusFailed) {
			t.Errorf("JUnit case %d (%s) does not match status %s", i, c.Name, st)
		}
	}
}

// A batch whose jobs cannot run as written is refused before any job runs.
func TestBatchRefusesBadJobs(t *testing.T) {
	dir := t.TempDir()
	s := quant.Scheme{Bits: 4, GroupSize: 128}
	a, b := tinyJob(t, "a", filepath.Join(dir, "x"), s), tinyJob(t, "b", filepath.Join(dir, "x"), s)
	noRef := tinyJob(t, "c", filepath.Join(dir, "c"), s)
	noRef.Verify = tinyVerify(t, evaluate.Thresholds{MaxKL: 0.1})
	noRef.Verify.Eval.Reference = ""
	export := tinyJob(t, "d", filepath.Join(dir, "d"), s)
	export.Export = []string{"onnx"}
	for _, tc := range []struct {
		jobs []Job
		want string
	}{
		{[]Job{a, b}, "like job a"},
		{[]Job{a, a}, "two jobs have this name"},
		{[]Job{noRef}, "need a reference"},
		{[]Job{export}, `unknown export "onnx"`},
	} {
		_, err := Run(context.Background(), tc.jobs, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused batch wrote %d entries", len(entries))
	}
}

// A batch replaces only outputs qpack wrote; a stopped batch runs nothing more.
func TestBatchOwnOutputsAndStop(t *testing.T) {
	dir := t.TempDir()
	foreign := filepath.Join(dir, "foreign")
	if err := os.MkdirAll(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(foreign, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	j := tinyJob(t, "foreign", foreign, quant.Scheme{Bits: 4, GroupSize: 128})
	s, err := Run(context.Background(), []Job{j}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Jobs[0].Status != StatusFailed || !strings.Contains(s.Jobs[0].Error, "not a finished qpack output") {
		t.Errorf("overwriting a foreign directory: %s %q", s.Jobs[0].Status, s.Jobs[0].Error)
	}
	if b, err := os.ReadFile(filepath.Join(foreign, "notes.txt")); err != nil || string(b) != "mine" {
		t.Errorf("the foreign directory was touched: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	j2 := tinyJob(t, "later", filepath.Join(dir, "later"), quant.Scheme{Bits: 4, GroupSize: 128})
	s, err = Run(ctx, []Job{j2}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Jobs[0].Status != StatusNotRun || s.ExitCode != ExitJobFailed {
		t.Errorf("a stopped batch: %v exit %d", statuses(s), s.ExitCode)
	}
	if _, err := os.Stat(j2.Output); !os.IsNotExist(err) {
		t.Errorf("a stopped batch wrote %s", j2.Output)
	}
}

// Jobs run at once give the same outputs as in order.
func TestBatchParallel(t *testing.T) {
	dir := t.TempDir()
	var jobs []Job
	for i, s := range []quant.Scheme{{Bits: 4, GroupSize: 128}, {Bits: 8, GroupSize: 128}, {Bits: 3, GroupSize: 128, Sym: true}} {
		jobs = append(jobs, tinyJob(t, s.String(), filepath.Join(dir, "p", s.String()), s))
		jobs[i].Options.InputHash = convert.HashNone
	}
	s, err := Run(context.Background(), jobs, Options{Parallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range s.Jobs {
		if r.Status != StatusPassed {
			t.Fatalf("%s: %s %s", r.Name, r.Status, r.Error)
		}
		seq := jobs[0]
		for _, j := range jobs {
			if j.Name == r.Name {
				seq = j
			}
		}
		seq.Output = filepath.Join(dir, "s", r.Name)
		if _, err := convert.Convert(seq.Source, seq.Output, seq.Options); err != nil {
			t.Fatal(err)
		}
		a, _ := os.ReadFile(filepath.Join(r.Output, "model.safetensors"))
		b, _ := os.ReadFile(filepath.Join(seq.Output, "model.safetensors"))
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Errorf("%s: the parallel job's output differs from a conversion on its own", r.Name)
		}
	}
}
