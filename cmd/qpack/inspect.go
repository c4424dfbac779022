package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/inspect"
)

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "describe a checkpoint's or GGUF file's tensors, types, shapes, sizes, bits per weight and metadata (headers only)",
		ArgsUsage: "FILE|DIR",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("inspect needs exactly one FILE or DIR argument")
			}
			r, err := inspect.Inspect(c.Args().First())
			if err != nil {
				return err
			}
			if c.Bool("json") {
				return r.WriteJSON(c.App.Writer)
			}
			return r.WriteText(c.App.Writer)
		},
	}
}
