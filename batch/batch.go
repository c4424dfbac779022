// Package batch runs many conversions as one CI job: each job converts (or finds its output up
// to date), verifies and exports, and the batch reports a JSON summary, JUnit XML and an exit code.
package batch

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/evaluate"
)

// Job is one conversion of a batch, its options resolved, with what to do after it.
type Job struct {
	Name           string
	Source, Output string
	Options        convert.Options
	// Verify, when set, evaluates the output and checks thresholds as `qpack verify` does.
	Verify *Verify
	// Export names exporters (Options.Exporters) run on the output after it is verified.
	Export []string
}

// Verify is a job's `qpack verify`: the evaluation and the thresholds it must meet.
type Verify struct {
	Eval       evaluate.Options
	Thresholds evaluate.Thresholds
}

// Job statuses, in JobResult.Status.
const (
	StatusPassed       = "passed"        // converted (and verified, exported)
	StatusSkipped      = "skipped"       // the output was up to date (verification still ran)
	StatusVerifyFailed = "verify-failed" // converted, but a threshold does not hold
	StatusFailed       = "failed"        // the job could not run: its error says why
	StatusInterrupted  = "interrupted"   // stopped by a signal; its temporary output was removed
	StatusNotRun       = "not-run"       // the batch stopped before it
)

// JobResult is one job's line of the batch summary.
type JobResult struct {
	Name    string  `json:"name"`
	Source  string  `json:"source"`
	Output  string  `json:"output"`
	Status  string  `json:"status"`
	Seconds float64 `json:"seconds"`
	// Bytes and BPW are the output's size and the bits per weight over its quantized tensors.
	Bytes  int64            `json:"bytes,omitempty"`
	BPW    float64          `json:"bpw,omitempty"`
	Verify *evaluate.Report `json:"verify,omitempty"`
	Reason string           `json:"reason,omitempty"` // why it was skipped or redone
	Error  string           `json:"error,omitempty"`
}

// Summary is the batch's JSON report.
type Summary struct {
	Tool     string         `json:"tool"`
	Version  string         `json:"version"`
	Started  time.Time      `json:"started"`
	Seconds  float64        `json:"seconds"`
	ExitCode int            `json:"exit_code"`
	Counts   map[string]int `json:"counts"`
	Jobs     []JobResult    `json:"jobs"`
}

// Options tune RunBatch.
type Options struct {
	// Parallel jobs run at once (default 1, in order).
	Parallel int
	// Force redoes jobs whose output is up to date.
	Force bool
	// Exporters by name, for Job.Export.
	Exporters map[string]func(output string) error
	// Log receives a line when each job starts and ends; nil discards.
	Log     io.Writer
	Version string
}

// Exit codes of a batch (Summary.ExitCode).
const (
	ExitOK           = 0
	ExitVerifyFailed = 1 // every job ran; a verification threshold failed
	ExitJobFailed    = 2 // a job could not run (or the batch was interrupted)
)

// CheckJobs refuses, before anything runs, a batch whose jobs cannot be run as written: no
// name, source or output, two jobs writing one output, an unknown exporter, thresholds that
// need a reference without one.
func CheckJobs(jobs []Job, exporters map[string]func(string) error) error {
	outputs := map[string]string{}
	names := map[string]bool{}
	for i, j := range jobs {
		id := j.Name
		if id == "" {
			return fmt.Errorf("job %d has no name", i+1)
		}
		if names[id] {
			return fmt.Errorf("job %s: two jobs have this name", id)
		}
		names[id] = true
		if j.Source == "" || j.Output == "" {
			return fmt.Errorf("job %s: needs a source and an output", id)
		}
		out := filepath.Clean(j.Output)
		if other, ok := outputs[out]; ok {
			return fmt.Errorf("job %s: writes %s, like job %s", id, j.Output, other)
		}
		outputs[out] = id
		for _, e := range j.Export {
			if exporters[e] == nil {
				return fmt.Errorf("job %s: unknown export %q", id, e)
			}
		}
		if v := j.Verify; v != nil {
			if v.Thresholds == (evaluate.Thresholds{}) {
				return fmt.Errorf("job %s: verify needs at least one threshold", id)
			}
			if v.Thresholds.NeedsReference() && v.Eval.Reference == "" {
				return fmt.Errorf("job %s: the verify thresholds on KL, top-1 agreement and perplexity increase need a reference", id)
			}
			if v.Eval.Data == "" {
				return fmt.Errorf("job %s: verify needs data", id)
			}
		}
	}
	return nil
}

// Run runs the jobs, opt.Parallel at a time in order, and returns the summary. A job whose
// output is up to date (UpToDate) is skipped unless opt.Force; its verification still runs, so
// a rerun gates on the same thresholds. When ctx is done (SIGINT, say) the running jobs stop,
// their temporary outputs are removed, and the jobs not started are reported as not run.
func Run(ctx context.Context, jobs []Job, opt Options) (*Summary, error) {
	if err := CheckJobs(jobs, opt.Exporters); err != nil {
		return nil, err
	}
	start := time.Now()
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	log = &lockedWriter{w: log}
	s := &Summary{Tool: "qpack", Version: opt.Version, Started: start, Jobs: make([]JobResult, len(jobs)), Counts: map[string]int{}}
	calibs := convert.NewCalibrationCache()
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, opt.Parallel))
	for i, j := range jobs {
		s.Jobs[i] = JobResult{Name: j.Name, Source: j.Source, Output: j.Output, Status: StatusNotRun}
		select {
		case <-ctx.Done():
			continue
		case sem <- struct{}{}:
		}
		if ctx.Err() != nil { // both were ready: a stopped batch starts nothing
			<-sem
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			j.Options.Context, j.Options.Calibrations = ctx, calibs
			fmt.Fprintf(log, "batch: job %s: %s → %s\n", j.Name, j.Source, j.Output)
			s.Jobs[i] = runJob(ctx, j, opt)
			r := s.Jobs[i]
			line := fmt.Sprintf("batch: job %s: %s in %.1f s", j.Name, r.Status, r.Seconds)
			if r.Error != "" {
				line += ": " + r.Error
			}
			fmt.Fprintln(log, line)
		})
	}
	wg.Wait()
	s.Seconds = time.Since(start).Seconds()
	s.ExitCode = ExitOK
	for _, r := range s.Jobs {
		s.Counts[r.Status]++
		switch r.Status {
		case StatusFailed, StatusInterrupted, StatusNotRun:
			s.ExitCode = ExitJobFailed
		case StatusVerifyFailed:
			s.ExitCode = max(s.ExitCode, ExitVerifyFailed)
		}
	}
	return s, nil
}

// runJob converts (or skips), verifies and exports one job.
func runJob(ctx context.Context, j Job, opt Options) (r JobResult) {
	start := time.Now()
	r = JobResult{Name: j.Name, Source: j.Source, Output: j.Output}
	defer func() { r.Seconds = time.Since(start).Seconds() }()
	fail := func(err error) JobResult {
		r.Status, r.Error = StatusFailed, err.Error()
		if ctx.Err() != nil {
			r.Status = StatusInterrupted
		}
		return r
	}
	upToDate := false
	if !opt.Force {
		var err error
		if upToDate, r.Reason, err = convert.UpToDate(j.Source, j.Output, j.Options); err != nil {
			return fail(err)
		}
		if r.Reason == convert.NoOutputYet {
			r.Reason = ""
		}
	}
	if upToDate {
		r.Status = StatusSkipped
		prov, err := convert.ReadProvenance(j.Output)
		if err != nil {
			return fail(err)
		}
		r.Bytes, r.BPW = prov.Plan.Totals.Bytes, prov.Plan.Totals.CandidateBPW
	} else {
		if err := convert.CheckOwnOutput(j.Output); err != nil {
			return fail(err)
		}
		j.Options.Overwrite = true // an earlier qpack output that is out of date is redone
		rep, err := convert.Convert(j.Source, j.Output, j.Options)
		if err != nil {
			return fail(err)
		}
		r.Status, r.Bytes, r.BPW = StatusPassed, rep.OutBytes, rep.QuantBPW
	}
	if j.Verify != nil {
		rep, err := evaluateStoppable(ctx, j.Output, j.Verify.Eval)
		if err != nil {
			return fail(fmt.Errorf("verify: %w", err))
		}
		r.Verify = rep
		if err := j.Verify.Thresholds.Check(rep); err != nil {
			r.Status, r.Error = StatusVerifyFailed, err.Error()
			return r
		}
	}
	for _, e := range j.Export {
		if err := opt.Exporters[e](j.Output); err != nil {
			return fail(fmt.Errorf("export %s: %w", e, err))
		}
	}
	return r
}

// evaluateStoppable runs evaluate.Run, returning early when ctx is done (the evaluation writes
// nothing, so it is left to finish in the background of a process that is about to exit).
func evaluateStoppable(ctx context.Context, dir string, o evaluate.Options) (*evaluate.Report, error) {
	type result struct {
		r   *evaluate.Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := evaluate.Run(dir, o)
		done <- result{r, err}
	}()
	select {
	case res := <-done:
		return res.r, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// lockedWriter serialises the log lines of jobs running at once.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
