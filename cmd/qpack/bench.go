package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/convert"
)

// benchCommand is `qpack bench read DIR`. The benchmark is named by the first argument rather
// than a cli subcommand, because flagsFirst moves flags next to the command name.
func benchCommand() *cli.Command {
	return &cli.Command{
		Name: "bench",
		Usage: "measure this machine's ceilings to compare conversions with; `bench read DIR` reads every tensor of a checkpoint " +
			"the way `convert --device cuda` does, then its files with plain reads (like cat); the page cache is left as found",
		ArgsUsage: "read DIR",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "workers", Value: convert.DefaultGPUSlots + 1, Usage: "read: tensors read at once (convert on a GPU runs one worker per GPU slot and one more)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 2 || c.Args().First() != "read" {
				return fmt.Errorf("usage: qpack bench read DIR")
			}
			if c.Int("workers") < 1 {
				return fmt.Errorf("--workers must be at least 1")
			}
			src := c.Args().Get(1)
			tensors, err := convert.ReadTensors(src, c.Int("workers"))
			if err != nil {
				return err
			}
			files, err := convert.ReadFiles(src)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "tensors (%d workers, as convert reads): %s\n", c.Int("workers"), tensors)
			fmt.Fprintf(c.App.Writer, "files (sequential reads, like cat):    %s\n", files)
			return nil
		},
	}
}
