package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
	"go.yaml.in/yaml/v3"

	"github.com/qpack-dev/qpack/batch"
	"github.com/qpack-dev/qpack/convert"
)

func batchCommand() *cli.Command {
	return &cli.Command{
		Name:  "batch",
		Usage: "run the conversions (with verification) listed in a YAML or JSON jobs file; resumable; JSON summary and JUnit XML for CI",
		Description: `A jobs file lists jobs; each has a name, a source, an output, any of convert's flags as keys
(as in convert --config), an optional verify map of verify's flags, and an optional export list:

  defaults:                 # optional: keys every job starts from
    format: qpack
    calib: calib.txt
  jobs:
    - name: tiny-int4
      source: models/tiny
      output: out/tiny-int4
      scheme: int4-g128-asym
      verify: {data: heldout.txt, reference: models/tiny, max-ppl-increase: 0.05}

Relative paths are relative to the jobs file. A job whose output exists with a provenance that
matches (qpack version, method, format, options, calibration data, input digests, plan) is skipped
(its verification still runs) unless --force. Exit code: 0 every job passed, 1 a verify threshold
failed, 2 a job failed to run (or the batch was interrupted).`,
		ArgsUsage: "JOBS.yaml",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: 1, Usage: "jobs run at once; with more than one, a job without a device key runs on the CPU"},
			&cli.BoolFlag{Name: "force", Usage: "redo jobs whose output is up to date"},
			&cli.StringFlag{Name: "summary", Usage: "write the JSON summary to this file (default: standard output)"},
			&cli.StringFlag{Name: "junit", Usage: "also write the results as JUnit XML to this file"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no per-tensor lines from the conversions"},
		},
		Action: runBatch,
	}
}

func runBatch(c *cli.Context) error {
	if c.NArg() != 1 {
		return fmt.Errorf("batch needs exactly one JOBS file")
	}
	jobs, err := readJobs(c.Args().First(), c.Int("jobs"))
	if err != nil {
		return err
	}
	var log io.Writer = c.App.ErrWriter
	for i := range jobs {
		if !c.Bool("quiet") && c.Int("jobs") <= 1 {
			jobs[i].Options.Log = log
		}
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := batch.Run(ctx, jobs, batch.Options{Parallel: c.Int("jobs"), Force: c.Bool("force"), Log: log,
		Version: version, Exporters: exporters()})
	if err != nil {
		return err
	}
	if err := writeSummary(c, s); err != nil {
		return err
	}
	for _, r := range s.Jobs {
		if r.Status != batch.StatusPassed && r.Status != batch.StatusSkipped {
			fmt.Fprintf(c.App.ErrWriter, "batch: job %s %s: %s\n", r.Name, r.Status, r.Error)
		}
	}
	if s.ExitCode != batch.ExitOK {
		return exitError{code: s.ExitCode, err: fmt.Errorf("batch: %s", countLine(s))}
	}
	fmt.Fprintf(c.App.ErrWriter, "batch: %s\n", countLine(s))
	return nil
}

// exporters are the `export` kinds a job may name.
func exporters() map[string]func(output string) error { return map[string]func(string) error{} }

func countLine(s *batch.Summary) string {
	var parts []string
	for _, st := range []string{batch.StatusPassed, batch.StatusSkipped, batch.StatusVerifyFailed, batch.StatusFailed, batch.StatusInterrupted, batch.StatusNotRun} {
		if n := s.Counts[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	return fmt.Sprintf("%d jobs: %s in %.1f s", len(s.Jobs), strings.Join(parts, ", "), s.Seconds)
}

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
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		if err := s.WriteJUnit(f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	return nil
}

// exitError makes main exit with a code other than 1.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }

// jobsFile is a jobs file: jobs, and keys every job starts from. A file that is a plain list
// holds jobs only.
type jobsFile struct {
	Defaults map[string]any   `yaml:"defaults"`
	Jobs     []map[string]any `yaml:"jobs"`
}

// jobKeys are a job's own keys; every other key is a convert flag.
var jobKeys = []string{"name", "source", "output", "verify", "export"}

// readJobs parses a jobs file into jobs whose options are read exactly as convert and verify
// read their flags.
func readJobs(path string, parallel int) ([]batch.Job, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f jobsFile
	if err := yaml.Unmarshal(raw, &f); err != nil {
		var list []map[string]any
		if yaml.Unmarshal(raw, &list) != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		f.Jobs = list
	}
	if len(f.Jobs) == 0 {
		return nil, fmt.Errorf("%s: no jobs", path)
	}
	base := filepath.Dir(path)
	var jobs []batch.Job
	for i, keys := range f.Jobs {
		merged := map[string]any{}
		for k, v := range f.Defaults {
			merged[k] = v
		}
		for k, v := range keys {
			merged[k] = v
		}
		name := fmt.Sprint(merged["name"])
		if merged["name"] == nil {
			name = fmt.Sprintf("%d", i+1)
		}
		j, err := jobFromKeys(name, merged, base, parallel)
		if err != nil {
			return nil, fmt.Errorf("%s: job %s: %w", path, name, err)
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

func jobFromKeys(name string, keys map[string]any, base string, parallel int) (batch.Job, error) {
	j := batch.Job{Name: name, Source: resolvePath(base, keys["source"]), Output: resolvePath(base, keys["output"])}
	if j.Source == "" || j.Output == "" {
		return j, fmt.Errorf("needs a source and an output")
	}
	flags := map[string]any{}
	for k, v := range keys {
		if !slices.Contains(jobKeys, k) {
			flags[k] = v
		}
	}
	for _, k := range []string{"calib", "plan"} {
		if v, ok := flags[k]; ok {
			flags[k] = resolvePath(base, v)
		}
	}
	if _, ok := flags["device"]; !ok && parallel > 1 {
		flags["device"] = convert.DeviceCPU // jobs at once share the machine; one GPU is not shared
	}
	var err error
	if j.Options, err = optionsFromKeys(flags, j.Source); err != nil {
		return j, err
	}
	j.Options.Version = version
	if v, ok := keys["verify"]; ok {
		if j.Verify, err = verifyFromKeys(v, base); err != nil {
			return j, fmt.Errorf("verify: %w", err)
		}
	}
	if v, ok := keys["export"]; ok {
		j.Export = listOf(v)
	}
	return j, nil
}

func resolvePath(base string, v any) string {
	if v == nil {
		return ""
	}
	p := fmt.Sprint(v)
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(base, p)
}

// notJobKeys are convert flags a job may not set: the batch decides where output goes and
// what is printed, and a job's keys replace a config file.
var notJobKeys = []string{"output", "o", "overwrite", "report", "quiet", "q", "config"}

// optionsFromKeys reads convert.Options from a job's keys, parsed as convert's flags.
func optionsFromKeys(keys map[string]any, source string) (convert.Options, error) {
	var opt convert.Options
	cmd := convertCommand()
	err := parseKeysAs(cmd, keys, notJobKeys, []string{"--output=unused", source}, func(c *cli.Context) (err error) {
		opt, err = fullConvertOptions(c)
		return err
	})
	return opt, err
}

// verifyFromKeys reads a job's verify map, parsed as verify's flags.
func verifyFromKeys(v any, base string) (*batch.Verify, error) {
	keys, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("must be a map of verify's flags (data, reference, max-kl, …)")
	}
	keys = maps(keys)
	for _, k := range []string{"data", "reference"} {
		if p, ok := keys[k]; ok {
			keys[k] = resolvePath(base, p)
		}
	}
	var out batch.Verify
	err := parseKeysAs(verifyCommand(), keys, []string{"json"}, []string{"unused-model"}, func(c *cli.Context) error {
		out = batch.Verify{Eval: evalOptions(c), Thresholds: verifyThresholds(c)}
		return nil
	})
	return &out, err
}

func maps(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// parseKeysAs parses keys as the flags of cmd (each key a flag name, list values repeated)
// followed by the extra arguments, and calls read with the parsed context instead of cmd's
// action. A key that is not one of cmd's flags, or is in refused, is an error naming it.
func parseKeysAs(cmd *cli.Command, keys map[string]any, refused, extra []string, read func(*cli.Context) error) error {
	known := map[string]bool{}
	for _, f := range cmd.Flags {
		for _, n := range f.Names() {
			known[n] = !slices.Contains(refused, n)
		}
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	args := []string{"qpack", cmd.Name}
	for _, k := range names {
		if !known[k] {
			return fmt.Errorf("unknown key %q (keys are %s's flag names%s)", k, cmd.Name, refusedNote(refused))
		}
		for _, v := range listOf(keys[k]) {
			args = append(args, "--"+k+"="+v)
		}
	}
	args = append(args, extra...)
	cmd.Action = read
	app := &cli.App{Name: "qpack", Commands: []*cli.Command{cmd}, Writer: io.Discard, ErrWriter: io.Discard,
		ExitErrHandler: func(*cli.Context, error) {}}
	return app.Run(args)
}

func refusedNote(refused []string) string {
	if len(refused) == 0 {
		return ""
	}
	return ", except " + strings.Join(refused, ", ")
}
