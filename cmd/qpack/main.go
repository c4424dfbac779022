// Command qpack converts Hugging Face checkpoints into quantized, bit-packed checkpoints and
// inspects, evaluates and verifies them. This file only wires flags to the packages.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3".
var version = "dev"

func commit() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

func newApp() *cli.App {
	return &cli.App{
		Name:    "qpack",
		Usage:   "quantize and bit-pack Hugging Face checkpoints (GPTQ, AWQ, compressed-tensors, qpack)",
		Version: fmt.Sprintf("%s (commit %s)", version, commit()),
		Commands: []*cli.Command{
			benchCommand(),
			convertCommand(),
			dequantizeCommand(),
			doctorCommand(),
			evalCommand(),
			{Name: "export", Usage: "write a checkpoint in another runtime's format", Subcommands: []*cli.Command{exportGGUFCommand()}},
			inspectCommand(),
			planCommand(),
			synthCommand(),
			verifyCommand(),
		},
		// Errors are printed once, by main, with exit code 1.
		ExitErrHandler: func(*cli.Context, error) {},
	}
}

func main() {
	app := newApp()
	if err := app.Run(flagsFirst(app, os.Args)); err != nil {
		fmt.Fprintln(os.Stderr, "qpack:", err)
		os.Exit(1)
	}
}
