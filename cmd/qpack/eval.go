package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/evaluate"
	"github.com/qpack-dev/qpack/internal/progress"
)

func evalFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "data", Usage: "held-out data: token ids (.npy) or text, tokenized with the model's tokenizer.json (required)", Required: true},
		&cli.IntFlag{Name: "seq-len", Value: 512, Usage: "tokens per sequence; sequences are scored independently"},
		&cli.IntFlag{Name: "max-seqs", Usage: "evaluate at most this many sequences (default: all that fit)"},
		&cli.StringFlag{Name: "reference", Usage: "reference checkpoint: adds KL divergence (mean, p99), top-1 agreement and Δperplexity"},
		&cli.StringFlag{Name: "device", Value: "auto", Usage: "where the forward pass runs: auto (the GPU when there is one), cpu or cuda"},
		&cli.BoolFlag{Name: "tf32", Usage: "GPU: TF32 matrix products (several times faster; relative errors near 3e-4 instead of 1e-6)"},
		&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
		&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no progress line while sequences are scored"},
	}
}

func runEval(c *cli.Context) (*evaluate.Report, error) {
	if c.NArg() != 1 {
		return nil, fmt.Errorf("%s needs exactly one MODEL argument", c.Command.Name)
	}
	noteSlowPath(c.App.ErrWriter)
	if err := useOnlyGPUs(c.String("device"), []int{0}); err != nil { // the forward pass runs on GPU 0
		return nil, err
	}
	o := evaluate.Options{Data: c.String("data"), SeqLen: c.Int("seq-len"),
		MaxSeqs: c.Int("max-seqs"), Reference: c.String("reference"), Device: c.String("device"), TF32: c.Bool("tf32"),
		Logf: func(format string, args ...any) { fmt.Fprintf(c.App.ErrWriter, format, args...) }}
	if !c.Bool("quiet") {
		bar := progress.New(c.App.ErrWriter, c.Command.Name, "sequences")
		defer bar.Finish()
		o.Progress = func(done, total int) { bar.Update(done, total, 0, 0) }
	}
	return evaluate.Run(c.Args().First(), o)
}

func printEval(w io.Writer, r *evaluate.Report, asJSON bool) error {
	if asJSON {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	fmt.Fprintf(w, "%s: perplexity %.4f over %d tokens (%d sequences of %d) on %s in %.1f s\n", r.Model, r.Perplexity, r.Tokens, r.Sequences, r.SeqLen, r.Device, r.Seconds)
	if r.Reference != "" {
		fmt.Fprintf(w, "reference %s: perplexity %.4f; Δperplexity %+.4f (%+.2f%%); KL mean %.5f, p99 %.5f; top-1 agreement %.4f\n",
			r.Reference, r.ReferencePerplexity, r.DeltaPerplexity, 100*r.DeltaPerplexity/r.ReferencePerplexity, r.MeanKL, r.P99KL, r.Top1Agreement)
	}
	return nil
}

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:      "eval",
		Usage:     "perplexity of a checkpoint (plain or quantized) on held-out data; with --reference also KL divergence and top-1 agreement",
		ArgsUsage: "MODEL",
		Flags:     evalFlags(),
		Action: func(c *cli.Context) error {
			r, err := runEval(c)
			if err != nil {
				return err
			}
			return printEval(c.App.Writer, r, c.Bool("json"))
		},
	}
}

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name:      "verify",
		Usage:     "eval with thresholds: exit 1 with a message when any is exceeded (for CI)",
		ArgsUsage: "MODEL",
		Flags: append(evalFlags(),
			&cli.Float64Flag{Name: "max-ppl", Usage: "maximum perplexity"},
			&cli.Float64Flag{Name: "max-ppl-increase", Usage: "maximum relative perplexity increase over the reference (0.02 = 2%)"},
			&cli.Float64Flag{Name: "max-kl", Usage: "maximum mean KL divergence from the reference, nats"},
			&cli.Float64Flag{Name: "max-p99-kl", Usage: "maximum 99th-percentile KL divergence, nats"},
			&cli.Float64Flag{Name: "min-top1", Usage: "minimum top-1 agreement with the reference, 0..1"},
		),
		Action: func(c *cli.Context) error {
			t := evaluate.Thresholds{MaxPerplexity: c.Float64("max-ppl"), MaxPerplexityIncrease: c.Float64("max-ppl-increase"),
				MaxKL: c.Float64("max-kl"), MaxP99KL: c.Float64("max-p99-kl"), MinTop1: c.Float64("min-top1")}
			if t == (evaluate.Thresholds{}) {
				return fmt.Errorf("verify needs at least one threshold (--max-ppl, --max-ppl-increase, --max-kl, --max-p99-kl, --min-top1)")
			}
			r, err := runEval(c)
			if err != nil {
				return err
			}
			if err := printEval(c.App.Writer, r, c.Bool("json")); err != nil {
				return err
			}
			if err := t.Check(r); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, "verified: every threshold holds")
			return nil
		},
	}
}
