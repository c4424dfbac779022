package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/internal/synth"
)

func synthCommand() *cli.Command {
	d := synth.Llama2_7B
	return &cli.Command{
		Name:      "synth",
		Usage:     "write a synthetic Llama-shaped (with --experts Mixtral-shaped) BF16 checkpoint with random weights (for benchmarks; default: Llama-2-7B's shape)",
		ArgsUsage: "DIR",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "layers", Value: d.Layers},
			&cli.IntFlag{Name: "hidden", Value: d.Hidden},
			&cli.IntFlag{Name: "intermediate", Value: d.Intermediate},
			&cli.IntFlag{Name: "heads", Value: d.Heads},
			&cli.IntFlag{Name: "kv-heads", Value: d.KVHeads},
			&cli.IntFlag{Name: "vocab", Value: d.Vocab},
			&cli.Uint64Flag{Name: "seed", Value: 1},
			&cli.IntFlag{Name: "experts", Usage: "make every MLP a mixture of this many experts of --intermediate each (Mixtral's layout)"},
			&cli.IntFlag{Name: "experts-per-token", Value: 2, Usage: "with --experts: experts each token is routed to"},
			&cli.IntFlag{Name: "calib-ids", Usage: "also write " + synth.CalibIDsFile + ": this many random token ids to calibrate with (--calib DIR/" + synth.CalibIDsFile + ")"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("synth needs exactly one DIR argument")
			}
			cfg := synth.Config{Layers: c.Int("layers"), Hidden: c.Int("hidden"), Intermediate: c.Int("intermediate"),
				Heads: c.Int("heads"), KVHeads: c.Int("kv-heads"), Vocab: c.Int("vocab"), Seed: c.Uint64("seed"), CalibIDs: c.Int("calib-ids")}
			if c.Int("experts") > 0 {
				cfg.Experts, cfg.ExpertsPerToken = c.Int("experts"), c.Int("experts-per-token")
			}
			return synth.Write(c.Args().First(), cfg)
		},
	}
}
