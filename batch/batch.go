// Package batch runs a file's worth of conversions for CI: each job converts (unless its output
// is up to date), verifies and exports, and the batch ends in one summary and an exit code.
package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/evaluate"
)

// Job is one conversion of a batch: a source, an output and the options `qpack convert`
// would take, then optional verification and exports of the output.
type Job struct {
	Name    string
	Source  string
	Output  string
	Options convert.Options
	// Report, when set, is where the conversion's JSON report is written (convert --report).
	Report string
	// Verify, when set, evaluates the output and checks its thresholds (qpack verify).
	Verify *Verify
	// Export names exporters (Exporters) run on the verified output, in order.
	Export []string
}

// Verify is a job's quality gate: the evaluation and the thresholds it must meet.
type Verify struct {
	Eval       evaluate.Options
	Thresholds evaluate.Thresholds
}

// Exporter writes another form of a finished checkpoint (an ONNX graph, say) from the checkpoint
// at dir, with a line or so to log (never nil); it must write to a temporary name and rename when complete, like Convert.
type Exporter func(ctx context.Context, dir string, log io.Writer) error

// Exporters are the export kinds a job may name; an exporter package adds itself here
// (Exporters["onnx"] = ...).
var Exporters = map[string]Exporter{}

// Options say how to run a batch.
type Options struct {
	// Jobs is how many jobs run at once (default 1: in order).
	Jobs int
	// Force converts every job, even one whose output is up to date.
	Force bool
	// Log receives a line per job started, skipped, finished or failed; nil discards.
	Log io.Writer
	// JobLog, when set, receives the conversions' own per-tensor lines, each prefixed with
	// the job's name.
	JobLog io.Writer
	// Progress is told of each job finished (done, total; bytes are 0).
	Progress convert.ProgressFunc
	// Context stops the batch when cancelled: the running jobs stop and remove their staging
	// directories, finished jobs stay, and the jobs not started are reported as interrupted.
	Context context.Context
	// Shard, when set, runs only that slice of the jobs (see Shard); its summary records it.
	Shard *Shard
}

// Job statuses in a batch summary.
const (
	StatusPassed      = "passed"      // converted (and verified, when asked)
	StatusSkipped     = "skipped"     // the output was up to date (and verified, when asked)
	StatusFailed      = "failed"      // a verify threshold failed
	StatusError       = "error"       // the job could not run: bad source, bad options, I/O
	StatusInterrupted = "interrupted" // the batch was stopped before the job finished
)

// JobResult is one job's line in the batch summary.
type JobResult struct {
	Name    string  `json:"name"`
	Source  string  `json:"source"`
	Output  string  `json:"output"`
	Status  string  `json:"status"`
	Seconds float64 `json:"seconds"`
	// Bytes is the size of the output directory's files and BPW the quantized tensors' bits
	// per weight (scales and zero points counted).
	Bytes int64   `json:"bytes,omitempty"`
	BPW   float64 `json:"bpw,omitempty"`
	// With verification: the evaluation's numbers.
	Perplexity          float64 `json:"perplexity,omitempty"`
	ReferencePerplexity float64 `json:"reference_perplexity,omitempty"`
	MeanKL              float64 `json:"mean_kl,omitempty"`
	P99KL               float64 `json:"p99_kl,omitempty"`
	Top1Agreement       float64 `json:"top1_agreement,omitempty"`
	// UpToDate says why a skipped job was not converted again; Error what went wrong.
	UpToDate string   `json:"up_to_date,omitempty"`
	Error    string   `json:"error,omitempty"`
	Exported []string `json:"exported,omitempty"`
}

// Summary is the result of a batch.
type Summary struct {
	Jobs        []JobResult `json:"jobs"`
	Passed      int         `json:"passed"`
	Skipped     int         `json:"skipped"`
	Failed      int         `json:"failed"`
	Errors      int         `json:"errors"`
	Interrupted int         `json:"interrupted"`
	Seconds     float64     `json:"seconds"`
	// ExitCode is what the command exits with: 0 all passed, 1 a verify threshold failed,
	// 2 a job could not run or the batch was interrupted.
	ExitCode int `json:"exit_code"`
	// Shard, for a batch run with Options.Shard, says which jobs of the file it ran.
	Shard *Shard `json:"shard,omitempty"`
}

// CheckJobs refuses a batch that cannot run as written, before any job runs: a job without a
// name, source or output, two jobs with one name or one output, an unknown export kind.
func CheckJobs(jobs []Job) error {
	names, outputs := map[string]bool{}, map[string]string{}
	for i, j := range jobs {
		fail := func(format string, args ...any) error {
			return &JobError{Index: i, Name: j.Name, Err: fmt.Errorf(format, args...)}
		}
		switch {
		case j.Name == "":
			return fail("no name")
		case names[j.Name]:
			return fail("another job has the same name")
		case j.Source == "":
			return fail("no source")
		case j.Output == "":
			return fail("no output")
		}
		names[j.Name] = true
		out := filepath.Clean(j.Output)
		if other, ok := outputs[out]; ok {
			return fail("job %s writes the same output %s", other, j.Output)
		}
		outputs[out] = j.Name
		for _, kind := range j.Export {
			if Exporters[kind] == nil {
				return fail("export %q is not available (available: %s)", kind, strings.Join(exportKinds(), ", "))
			}
		}
	}
	return nil
}

// JobError is what is wrong with one job of a batch, by its place in the jobs file.
type JobError struct {
	Index int    // from 0, in file order
	Name  string // empty when the job has none
	Err   error
}

func (e *JobError) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("job %d: %v", e.Index+1, e.Err)
	}
	return fmt.Sprintf("job %d (%s): %v", e.Index+1, e.Name, e.Err)
}

func (e *JobError) Unwrap() error { return e.Err }

func exportKinds() []string {
	var kinds []string
	for k := range Exporters {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	if len(kinds) == 0 {
		return []string{"none yet"}
	}
	return kinds
}

// Run runs the jobs (opt.Jobs at a time, in order) and summarises them. Calibration data
// is loaded and tokenized once per source and calibration setting and shared by the jobs. The
// error is only for a batch that cannot start (CheckJobs); each job's failure is in its result.
func Run(jobs []Job, opt Options) (*Summary, error) {
	if err := CheckJobs(jobs); err != nil {
		return nil, err
	}
	var shard *Shard
	if opt.Shard != nil {
		s := *opt.Shard
		var err error
		if jobs, err = s.Select(jobs); err != nil {
			return nil, err
		}
		shard = &s
	}
	start := time.Now()
	ctx := opt.Context
	if ctx == nil {
		ctx = context.Background()
	}
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	log = &prefixWriter{w: log} // jobs log at once
	calibs := convert.NewCalibrationCache()
	results := make([]JobResult, len(jobs))
	var mu sync.Mutex
	done := 0
	sem := make(chan struct{}, max(1, opt.Jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			results[i] = JobResult{Name: j.Name, Source: j.Source, Output: j.Output, Status: StatusInterrupted, Error: "not started: the batch was interrupted"}
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i] = runJob(ctx, j, opt, calibs, log)
			r := results[i]
			switch r.Status {
			case StatusPassed, StatusSkipped:
				fmt.Fprintf(log, "job %s: %s in %.1fs\n", j.Name, r.Status, r.Seconds)
			default:
				fmt.Fprintf(log, "job %s: %s: %s\n", j.Name, strings.ToUpper(r.Status), r.Error)
			}
			if opt.Progress != nil {
				mu.Lock()
				done++
				opt.Progress(done, len(jobs), 0, 0)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	s := &Summary{Jobs: results, Seconds: time.Since(start).Seconds(), Shard: shard}
	s.count()
	return s, nil
}

// count tallies the statuses and sets the exit code.
func (s *Summary) count() {
	for _, r := range s.Jobs {
		switch r.Status {
		case StatusPassed:
			s.Passed++
		case StatusSkipped:
			s.Skipped++
		case StatusFailed:
			s.Failed++
		case StatusInterrupted:
			s.Interrupted++
		default:
			s.Errors++
		}
	}
	switch {
	case s.Errors > 0 || s.Interrupted > 0:
		s.ExitCode = 2
	case s.Failed > 0:
		s.ExitCode = 1
	}
}

// runJob converts (unless up to date), verifies and exports one job.
func runJob(ctx context.Context, j Job, bo Options, calibs *convert.CalibrationCache, log io.Writer) JobResult {
	start := time.Now()
	r := JobResult{Name: j.Name, Source: j.Source, Output: j.Output}
	fail := func(err error) JobResult {
		r.Status, r.Error = StatusError, err.Error()
		if ctx.Err() != nil {
			r.Status = StatusInterrupted
		}
		r.Seconds = time.Since(start).Seconds()
		return r
	}
	opt := j.Options
	opt.Context, opt.Calibrations = ctx, calibs
	opt.Log = nil
	if bo.JobLog != nil {
		opt.Log = &prefixWriter{w: bo.JobLog, prefix: "[" + j.Name + "] "}
	}
	fresh := ""
	if !bo.Force {
		var err error
		if fresh, err = convert.UpToDate(j.Source, j.Output, opt); err != nil {
			return fail(err)
		}
	}
	if fresh != "" {
		r.Status, r.UpToDate = StatusSkipped, fresh
		fmt.Fprintf(log, "job %s: %s is up to date (%s)\n", j.Name, j.Output, fresh)
		if err := outputSize(j.Output, &r); err != nil {
			return fail(err)
		}
	} else {
		fmt.Fprintf(log, "job %s: converting %s → %s\n", j.Name, j.Source, j.Output)
		if _, err := os.Stat(j.Output); err == nil && !opt.Overwrite {
			// A stale or forced output of qpack's is replaced (only once the new one is
			// complete); anything else is the user's.
			if !hasProvenance(j.Output) {
				return fail(fmt.Errorf("output %s exists and is not a checkpoint qpack wrote; remove it or set overwrite: true", j.Output))
			}
			opt.Overwrite = true
		}
		rep, err := convert.Convert(j.Source, j.Output, opt)
		if err != nil {
			return fail(err)
		}
		r.Status, r.BPW = StatusPassed, rep.QuantBPW
		if r.Bytes, err = dirBytes(j.Output); err != nil {
			return fail(err)
		}
		if j.Report != "" {
			if err := writeJSON(j.Report, rep); err != nil {
				return fail(err)
			}
		}
	}
	if j.Verify != nil {
		ev := j.Verify.Eval
		if ev.Reference == "" {
			ev.Reference = j.Source
		}
		rep, err := evaluate.Run(j.Output, ev)
		if err != nil {
			return fail(fmt.Errorf("verify: %w", err))
		}
		r.Perplexity, r.ReferencePerplexity, r.MeanKL, r.P99KL, r.Top1Agreement = rep.Perplexity, rep.ReferencePerplexity, rep.MeanKL, rep.P99KL, rep.Top1Agreement
		if err := j.Verify.Thresholds.Check(rep); err != nil {
			r.Status, r.Error = StatusFailed, err.Error()
			r.Seconds = time.Since(start).Seconds()
			return r
		}
	}
	for _, kind := range j.Export {
		if err := Exporters[kind](ctx, j.Output, log); err != nil { // the batch's log, never nil
			return fail(fmt.Errorf("export %s: %w", kind, err))
		}
		r.Exported = append(r.Exported, kind)
	}
	r.Seconds = time.Since(start).Seconds()
	return r
}

// hasProvenance reports whether dir is a checkpoint with qpack's provenance.
func hasProvenance(path string) bool {
	_, err := convert.ReadProvenance(path)
	return err == nil
}

// dirBytes is the size of the files in the output directory (or of the output file, GGUF).
func dirBytes(dir string) (int64, error) {
	if st, err := os.Stat(dir); err == nil && st.Mode().IsRegular() {
		return st.Size(), nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
	}
	return n, nil
}

// outputSize fills a skipped job's bytes and bits per weight from the checkpoint's files and
// its recorded plan.
func outputSize(dir string, r *JobResult) error {
	var err error
	if r.Bytes, err = dirBytes(dir); err != nil {
		return err
	}
	prov, err := convert.ReadProvenance(dir)
	if err != nil {
		return err
	}
	if prov.Plan != nil {
		r.BPW = prov.Plan.Totals.CandidateBPW
	}
	return nil
}

// prefixWriter starts every line with prefix; a job's lines stay recognisable when several
// jobs log at once. Writes are whole lines (convert logs with one Fprintf per line).
type prefixWriter struct {
	w      io.Writer
	prefix string
	mu     sync.Mutex
	midway bool // the last write did not end a line
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(b)
	var out []byte
	for len(b) > 0 {
		if !p.midway {
			out = append(out, p.prefix...)
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			out = append(out, b...)
			p.midway = true
			break
		}
		out = append(out, b[:i+1]...)
		b = b[i+1:]
		p.midway = false
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return n, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
