package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/convert"
)

func imatrixCommand() *cli.Command {
	return &cli.Command{
		Name:      "imatrix",
		Usage:     "measure each decoder linear's importance E[x²] on calibration data and write it as llama.cpp's imatrix file (for llama-quantize --imatrix, or convert --imatrix-file)",
		ArgsUsage: "SRC",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output imatrix file (required)", Required: true},
			&cli.StringFlag{Name: "calib", Usage: "calibration data: text (tokenized with the checkpoint's tokenizer) or .npy token ids (required)", Required: true},
			&cli.IntFlag{Name: "calib-samples", Value: 128, Usage: "calibration sequences (llama-imatrix's chunks)"},
			&cli.IntFlag{Name: "calib-seqlen", Value: 512, Usage: "tokens per calibration sequence (llama-imatrix's -c)"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: "where the forward pass runs: auto, cpu or cuda"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no progress lines"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("imatrix needs exactly one SRC argument")
			}
			o := convert.ImatrixOptions{Device: c.String("device"),
				Calib: convert.CalibOptions{File: c.String("calib"), Samples: c.Int("calib-samples"), SeqLen: c.Int("calib-seqlen")}}
			if !c.Bool("quiet") {
				o.Log = c.App.ErrWriter
			}
			ctx, stop := interruptContext()
			defer stop()
			o.Ctx = ctx
			if err := convert.WriteImatrix(c.Args().First(), c.String("output"), o); err != nil {
				return interruptedExit(ctx, "imatrix", err, "nothing was written")
			}
			fmt.Fprintf(c.App.Writer, "wrote %s\n", c.String("output"))
			return nil
		},
	}
}
