package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
	"go.yaml.in/yaml/v3"

	"github.com/qpack-dev/qpack/batch"
	"github.com/qpack-dev/qpack/evaluate"
	"github.com/qpack-dev/qpack/internal/progress"
)

func batchCommand() *cli.Command {
	return &cli.Command{
		Name:  "batch",
		Usage: "run a file of conversion jobs (each with convert's --config keys, optional verify thresholds and exports); resumable; exit 0 all passed, 1 a threshold failed, 2 a job failed to run",
		Description: `JOBS.yaml (or .json) is a list of jobs, or {jobs: [...]}. Each job has a name, a source and an
output, any key of a convert --config file (method, scheme, strategy, target-bpw, calib, format,
override, ...), an optional verify mapping whose keys are verify's flags (data, max-ppl, max-kl, ...;
the reference defaults to the job's source), and an optional export list. A job whose output is
up to date (same qpack version, method, format, input digests, calibration and plan) is skipped.`,
		ArgsUsage: "JOBS.yaml",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: 1, Usage: "jobs run at once (each uses every core; for CPU runs of small models)"},
			&cli.BoolFlag{Name: "force", Usage: "convert every job, even one whose output is up to date"},
			&cli.StringFlag{Name: "summary", Usage: "write the JSON summary to this file instead of standard output"},
			&cli.StringFlag{Name: "junit", Usage: "also write the summary as JUnit XML to this file (for CI test reports)"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no per-job log lines or progress; failures are still named"},
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "also the conversions' per-tensor lines, prefixed with the job's name"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("batch needs exactly one JOBS file")
			}
			jobs, err := readJobs(c.App, c.Args().First())
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			opt := batch.Options{Jobs: c.Int("jobs"), Force: c.Bool("force"), Context: ctx}
			if !c.Bool("quiet") {
				bar := progress.New(c.App.ErrWriter, "batch", "jobs")
				opt.Log, opt.Progress = bar.Log(c.App.ErrWriter), bar.Update
				defer bar.Finish()
				if c.Bool("verbose") {
					opt.JobLog = opt.Log
				}
			}
			s, err := batch.Run(jobs, opt)
			if err != nil {
				return err
			}
			if err := writeSummary(c, s); err != nil {
				return err
			}
			for _, r := range s.Jobs {
				if r.Error != "" {
					fmt.Fprintf(c.App.ErrWriter, "qpack batch: job %s %s: %s\n", r.Name, r.Status, r.Error)
				}
			}
			if s.ExitCode != 0 {
				return cli.Exit(fmt.Sprintf("qpack batch: %d passed, %d skipped, %d failed a threshold, %d could not run, %d interrupted",
					s.Passed, s.Skipped, s.Failed, s.Errors, s.Interrupted), s.ExitCode)
			}
			return nil
		},
	}
}

// writeSummary writes the JSON summary (to --summary or standard output) and the JUnit XML.
func writeSummary(c *cli.Context, s *batch.Summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if p := c.String("summary"); p != "" {
		err = os.WriteFile(p, b, 0o644)
	} else {
		_, err = c.App.Writer.Write(b)
	}
	if err != nil {
		return err
	}
	if p := c.String("junit"); p != "" {
		var x bytes.Buffer
		if err := s.WriteJUnit(&x); err != nil {
			return err
		}
		return os.WriteFile(p, x.Bytes(), 0o644)
	}
	return nil
}

// jobKeys are a job's own keys; every other key is a convert flag, as in a --config file.
var jobKeys = map[string]bool{"name": true, "source": true, "output": true, "verify": true, "export": true}

// readJobs reads a jobs file: a list of jobs, or a mapping whose only key is jobs.
func readJobs(app *cli.App, path string) ([]batch.Job, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if m, ok := doc.(map[string]any); ok {
		if len(m) != 1 || m["jobs"] == nil {
			return nil, fmt.Errorf("%s: want a list of jobs, or a mapping with the one key jobs", path)
		}
		doc = m["jobs"]
	}
	list, ok := doc.([]any)
	if !ok || len(list) == 0 {
		return nil, fmt.Errorf("%s: no jobs (want a list of mappings with name, source, output and convert's keys)", path)
	}
	var jobs []batch.Job
	for i, e := range list {
		values, ok := e.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: job %d is not a mapping", path, i+1)
		}
		j, err := readJob(app, values)
		if err != nil {
			return nil, fmt.Errorf("%s: job %d (%s): %w", path, i+1, j.Name, err)
		}
		jobs = append(jobs, j)
	}
	return jobs, batch.CheckJobs(jobs)
}

// readJob reads one job: its own keys, then the rest through convert's flags exactly as a
// --config file's, and its verify mapping through verify's flags.
func readJob(app *cli.App, values map[string]any) (batch.Job, error) {
	var j batch.Job
	text := func(key string) (string, error) {
		v, ok := values[key]
		if !ok {
			return "", nil
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("%s: want a string, got %v", key, v)
		}
		return s, nil
	}
	var err error
	if j.Name, err = text("name"); err != nil {
		return j, err
	}
	if j.Source, err = text("source"); err != nil {
		return j, err
	}
	if j.Output, err = text("output"); err != nil {
		return j, err
	}
	if v, ok := values["export"]; ok {
		j.Export = listOf(v)
	}
	flags := map[string]any{}
	for k, v := range values {
		if !jobKeys[k] {
			flags[k] = v
		}
	}
	c, err := flagContext(app, convertCommand(), flags)
	if err != nil {
		return j, err
	}
	if j.Options, err = convertCommandOptions(c); err != nil {
		return j, err
	}
	j.Report = c.String("report")
	if v, ok := values["verify"]; ok {
		m, ok := v.(map[string]any)
		if !ok {
			return j, fmt.Errorf("verify: want a mapping of verify's flags (data, max-ppl, ...)")
		}
		if j.Verify, err = readVerify(app, m); err != nil {
			return j, fmt.Errorf("verify: %w", err)
		}
	}
	return j, nil
}

// readVerify reads a job's verify mapping through verify's flags.
func readVerify(app *cli.App, values map[string]any) (*batch.Verify, error) {
	c, err := flagContext(app, verifyCommand(), values)
	if err != nil {
		return nil, err
	}
	v := &batch.Verify{
		Eval: evaluate.Options{Data: c.String("data"), SeqLen: c.Int("seq-len"), MaxSeqs: c.Int("max-seqs"),
			Reference: c.String("reference"), Device: c.String("device"), TF32: c.Bool("tf32")},
		Thresholds: evaluate.Thresholds{MaxPerplexity: c.Float64("max-ppl"), MaxPerplexityIncrease: c.Float64("max-ppl-increase"),
			MaxKL: c.Float64("max-kl"), MaxP99KL: c.Float64("max-p99-kl"), MinTop1: c.Float64("min-top1")},
	}
	if v.Eval.Data == "" {
		return nil, fmt.Errorf("data: held-out data is required")
	}
	if v.Thresholds == (evaluate.Thresholds{}) {
		return nil, fmt.Errorf("at least one threshold is required (max-ppl, max-ppl-increase, max-kl, max-p99-kl, min-top1)")
	}
	return v, nil
}

// flagContext parses values as the flags of cmd, the way applyConfig reads a config file, into
// a context of their own.
func flagContext(app *cli.App, cmd *cli.Command, values map[string]any) (*cli.Context, error) {
	set := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	for _, f := range cmd.Flags {
		if err := f.Apply(set); err != nil {
			return nil, err
		}
	}
	c := cli.NewContext(app, set, nil)
	c.Command = cmd
	return c, applyValues(c, "key", values)
}
