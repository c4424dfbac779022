package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/batch"
	"github.com/qpack-dev/qpack/onnx"
)

// exportCommand is the parent of the export formats (onnx, gguf).
func exportCommand() *cli.Command {
	return &cli.Command{
		Name:        "export",
		Usage:       "export a plain or quantized checkpoint for another runtime",
		Subcommands: []*cli.Command{exportONNXCommand(), exportGGUFCommand()},
	}
}

func exportONNXCommand() *cli.Command {
	return &cli.Command{
		Name:      "onnx",
		Usage:     "write an ONNX decoder graph with a KV cache (model.onnx + model.onnx.data)",
		ArgsUsage: "SRC",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output directory (required)", Required: true},
			&cli.StringFlag{Name: "onnx-ops", Value: string(onnx.MatMulNBits), Usage: "quantized linears as matmulnbits (com.microsoft.MatMulNBits) or qdq (DequantizeLinear → MatMul)"},
			&cli.BoolFlag{Name: "dequantize-unsupported", Usage: "write modules whose scheme the ops cannot hold (NF4, FP8, INT1) as float weights instead of refusing"},
			&cli.BoolFlag{Name: "overwrite", Usage: "replace the output directory if it exists"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("export onnx needs exactly one SRC argument")
			}
			r, err := onnx.Export(c.Args().First(), c.String("output"), onnx.Options{
				Ops:                   onnx.Ops(c.String("onnx-ops")),
				DequantizeUnsupported: c.Bool("dequantize-unsupported"),
				Overwrite:             c.Bool("overwrite"),
				Version:               version,
				Log:                   c.App.ErrWriter,
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "wrote %s: %s %d bytes, %s %d bytes; opset %d, IR %d; linears %v; %.2f s\n",
				r.Dir, onnx.ModelFile, r.ModelBytes, onnx.DataFile, r.DataBytes, r.Opset, r.IRVersion, r.Linears, r.Seconds)
			return nil
		},
	}
}

// A batch job's `export: [onnx]` writes OUTPUT.onnx/ beside the job's output, MatMulNBits
// linears, replacing an earlier export.
func init() {
	batch.Exporters["onnx"] = func(ctx context.Context, dir string, log io.Writer) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := onnx.Export(dir, filepath.Clean(dir)+".onnx", onnx.Options{Overwrite: true, Version: version})
		if err == nil {
			fmt.Fprintf(log, "exported %s (%d + %d bytes)\n", r.Dir, r.ModelBytes, r.DataBytes)
		}
		return err
	}
}
