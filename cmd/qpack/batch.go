package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
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
		Usage: "run a file of conversion jobs (each with convert's --config keys, optional verify thresholds and exports); resumable; exit 0 all passed, 1 a threshold failed, 2 a job failed to run or the jobs file is invalid",
		Description: `JOBS.yaml (or .json) is a list of jobs, or {jobs: [...]}. Each job has a name, a source and an
output, any key of a convert --config file (method, scheme, strategy, target-bpw, calib, format,
override, ...), an optional verify mapping whose keys are verify's flags (data, max-ppl, max-kl, ...;
the reference defaults to the job's source), and an optional export list. A job whose output is
up to date (same qpack version, method, format, input digests, calibration and plan) is skipped.`,
		ArgsUsage: "JOBS.yaml | --merge SUMMARY.json...",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: 1, Usage: "jobs run at once (each uses every core; for CPU runs of small models)"},
			&cli.BoolFlag{Name: "force", Usage: "convert every job, even one whose output is up to date"},
			&cli.StringFlag{Name: "summary", Usage: "write the JSON summary to this file instead of standard output"},
			&cli.StringFlag{Name: "junit", Usage: "also write the summary as JUnit XML to this file (for CI test reports)"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no per-job log lines or progress; failures are still named"},
			&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "also the conversions' per-tensor lines, prefixed with the job's name"},
			&cli.StringFlag{Name: "shard", Usage: "run only shard I/N of the jobs (I from 0; job k is in shard k mod N), for several machines; N alone takes I from JOB_COMPLETION_INDEX (Kubernetes Indexed Jobs)"},
			&cli.BoolFlag{Name: "merge", Usage: "merge the summaries of all shards (the arguments) into one summary, JUnit report and exit code"},
		},
		Action: func(c *cli.Context) error {
			if c.Bool("merge") {
				return mergeSummaries(c)
			}
			if c.NArg() != 1 {
				return fmt.Errorf("batch needs exactly one JOBS file")
			}
			jobs, err := readJobs(c.App, c.Args().First())
			if err != nil { // exit 2: nothing could run; 1 is kept for a failed threshold
				return cli.Exit("qpack batch: "+err.Error(), 2)
			}
			var shard *batch.Shard
			if spec := c.String("shard"); spec != "" {
				s, err := batch.ParseShard(spec)
				if err != nil {
					return cli.Exit("qpack batch: "+err.Error(), 2)
				}
				shard = &s
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			opt := batch.Options{Jobs: c.Int("jobs"), Force: c.Bool("force"), Context: ctx, Shard: shard}
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
			return finishBatch(c, s)
		},
	}
}

// finishBatch writes the summary and the JUnit report, names every failure on stderr and exits
// with the summary's code.
func finishBatch(c *cli.Context, s *batch.Summary) error {
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
}

// mergeSummaries is batch --merge: the shards' summaries (the arguments) as one.
func mergeSummaries(c *cli.Context) error {
	if c.NArg() == 0 {
		return cli.Exit("qpack batch --merge: name the shards' summary files", 2)
	}
	var shards []*batch.Summary
	for _, path := range c.Args().Slice() {
		b, err := os.ReadFile(path)
		if err != nil {
			return cli.Exit("qpack batch --merge: "+err.Error(), 2)
		}
		var s batch.Summary
		if err := json.Unmarshal(b, &s); err != nil {
			return cli.Exit(fmt.Sprintf("qpack batch --merge: %s: %v", path, err), 2)
		}
		shards = append(shards, &s)
	}
	s, err := batch.Merge(shards)
	if err != nil {
		return cli.Exit("qpack batch --"+err.Error(), 2)
	}
	return finishBatch(c, s)
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

// readJobs reads a jobs file: a list of jobs, or a mapping whose only key is jobs. Every error
// names the file and the line of the fault ("ci.yaml:5: job 2 (b): ...").
func readJobs(app *cli.App, path string) ([]batch.Job, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, yamlError(path, raw, err)
	}
	list, err := jobsList(&doc)
	if err != nil {
		return nil, fmt.Errorf("%s:%d: %w", path, lineOf(&doc), err)
	}
	var jobs []batch.Job
	var lines []int
	for i, n := range list.Content {
		values, keyLines, bad, err := mappingValues(n)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: job %d: %w", path, bad, i+1, err)
		}
		j, err := readJob(app, values)
		if err != nil {
			line := n.Line
			var ke *keyError
			if errors.As(err, &ke) {
				line = keyLines[ke.key]
			}
			return nil, fmt.Errorf("%s:%d: %w", path, line, &batch.JobError{Index: i, Name: j.Name, Err: err})
		}
		jobs = append(jobs, j)
		lines = append(lines, n.Line)
	}
	if err := batch.CheckJobs(jobs); err != nil {
		var je *batch.JobError
		if errors.As(err, &je) {
			return nil, fmt.Errorf("%s:%d: %w", path, lines[je.Index], err)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return jobs, nil
}

// jobsList finds the sequence of jobs in a parsed jobs file.
func jobsList(doc *yaml.Node) (*yaml.Node, error) {
	const want = "want a list of jobs (mappings with name, source, output and convert's keys), or a mapping with the one key jobs"
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, fmt.Errorf("no jobs: %s", want)
	}
	n := doc.Content[0]
	if n.Kind == yaml.MappingNode {
		if len(n.Content) != 2 || n.Content[0].Value != "jobs" {
			return nil, fmt.Errorf("%s", want)
		}
		n = n.Content[1]
	}
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		return nil, fmt.Errorf("no jobs: %s", want)
	}
	return n, nil
}

// mappingValues decodes a job's mapping into its keys' values, with the line of each key; on
// error, bad is the line at fault.
func mappingValues(n *yaml.Node) (values map[string]any, lines map[string]int, bad int, err error) {
	if n.Kind != yaml.MappingNode {
		return nil, nil, n.Line, fmt.Errorf("not a mapping (want name, source, output and convert's keys)")
	}
	values, lines = map[string]any{}, map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if _, dup := values[k.Value]; dup {
			return nil, nil, k.Line, fmt.Errorf("key %s appears twice (lines %d and %d)", k.Value, lines[k.Value], k.Line)
		}
		var x any
		if err := v.Decode(&x); err != nil {
			return nil, nil, k.Line, fmt.Errorf("%s: %w", k.Value, err)
		}
		values[k.Value], lines[k.Value] = x, k.Line
	}
	return values, lines, 0, nil
}

func lineOf(doc *yaml.Node) int {
	if len(doc.Content) > 0 {
		return doc.Content[0].Line
	}
	return 1
}

// yamlError names the line where a file stops being valid YAML: the YAML parser's own messages
// name the start of the enclosing block instead (line 1 for a bad indent on line 5). It is the
// first line whose prefix of the file does not parse.
func yamlError(path string, raw []byte, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if i := strings.Index(msg, ": "); strings.HasPrefix(msg, "line ") && i > 0 {
		msg = msg[i+2:]
	}
	lines := strings.SplitAfter(string(raw), "\n")
	for n := 1; n <= len(lines); n++ {
		var doc yaml.Node
		if yaml.Unmarshal([]byte(strings.Join(lines[:n], "")), &doc) != nil {
			return fmt.Errorf("%s:%d: invalid YAML: %s", path, n, msg)
		}
	}
	return fmt.Errorf("%s: invalid YAML: %s", path, msg)
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
			return "", &keyError{key, fmt.Errorf("want a string, got %v", v)}
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
			return j, &keyError{"verify", fmt.Errorf("want a mapping of verify's flags (data, max-ppl, ...)")}
		}
		if j.Verify, err = readVerify(app, m); err != nil {
			return j, &keyError{"verify", err}
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
	return c, applyValues(c, values)
}
