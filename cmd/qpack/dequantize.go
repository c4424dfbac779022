package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/safetensors"
)

func dequantizeCommand() *cli.Command {
	return &cli.Command{
		Name:      "dequantize",
		Usage:     "write a plain F16/BF16/F32 checkpoint back from a quantized one",
		ArgsUsage: "SRC",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output directory (required)", Required: true},
			&cli.StringFlag{Name: "dtype", Value: "F16", Usage: "dtype of the dequantized weights: F16, BF16 or F32"},
			&cli.BoolFlag{Name: "overwrite", Usage: "replace the output directory if it exists"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("dequantize needs exactly one SRC argument")
			}
			dtype := safetensors.DType(strings.ToUpper(c.String("dtype")))
			if err := convert.Dequantize(c.Args().First(), c.String("output"), dtype, c.Bool("overwrite")); err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "wrote %s\n", c.String("output"))
			return nil
		},
	}
}
