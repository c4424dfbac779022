package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/internal/progress"
)

func planCommand() *cli.Command {
	return &cli.Command{
		Name:      "plan",
		Usage:     "dry run: the scheme each tensor would get, why, its bytes and bits per weight; nothing is written",
		ArgsUsage: "SRC",
		Flags: append(planFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print the plan as JSON (replay it with convert --plan)"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no progress line while sensitivities are measured"},
			&cli.BoolFlag{Name: "explain", Usage: "print every tensor with the rule or measurement that chose its scheme (the default text output shows totals only)"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("plan needs exactly one SRC argument")
			}
			opt, err := convertOptions(c)
			if err != nil {
				return err
			}
			if err := useOnlyGPUs(opt.Device, opt.Devices); err != nil {
				return err
			}
			if !c.Bool("quiet") {
				bar := progress.New(c.App.ErrWriter, "plan: measured", "tensors")
				opt.Progress = bar.Update
				opt.Log = bar.Log(c.App.ErrWriter) // the statistics pass's line per block
				defer bar.Finish()
			}
			p, err := convert.Plan(c.Args().First(), opt)
			if err != nil {
				return err
			}
			switch {
			case c.Bool("json"):
				return p.WriteJSON(c.App.Writer)
			case c.Bool("explain"):
				return p.Explain(c.App.Writer)
			}
			t := p.Totals
			fmt.Fprintf(c.App.Writer, "%s plan: %d of %d tensors quantized; quantized tensors %.3f bits/weight; output %s bytes (%.3f bits/weight overall, input %s bytes)\n",
				p.Strategy, t.Quantized, t.Tensors, t.CandidateBPW, thousands(t.Bytes), t.BPW, thousands(t.InputBytes))
			for _, w := range p.Warnings {
				fmt.Fprintln(c.App.Writer, "warning:", w)
			}
			return nil
		},
	}
}
