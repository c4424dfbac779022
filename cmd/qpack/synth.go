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
		Usage:     "write a synthetic Llama-shaped BF16 checkpoint with random weights (for benchmarks; default: Llama-2-7B's shape)",
		ArgsUsage: "DIR",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "layers", Value: d.Layers},
			&cli.IntFlag{Name: "hidden", Value: d.Hidden},
			&cli.IntFlag{Name: "intermediate", Value: d.Intermediate},
			&cli.IntFlag{Name: "heads", Value: d.Heads},
			&cli.IntFlag{Name: "kv-heads", Value: d.KVHeads},
			&cli.IntFlag{Name: "vocab", Value: d.Vocab},
			&cli.Uint64Flag{Name: "seed", Value: 1},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("synth needs exactly one DIR argument")
			}
			cfg := synth.Config{Layers: c.Int("layers"), Hidden: c.Int("hidden"), Intermediate: c.Int("intermediate"),
				Heads: c.Int("heads"), KVHeads: c.Int("kv-heads"), Vocab: c.Int("vocab"), Seed: c.Uint64("seed")}
			return synth.Write(c.Args().First(), cfg)
		},
	}
}
