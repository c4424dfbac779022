// Command qpack converts Hugging Face checkpoints into quantized, bit-packed checkpoints and
// inspects, evaluates and verifies them. This file only wires flags to the packages.
package main

import (
	"errors"
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
		Usage:   "quantize and bit-pack Hugging Face checkpoints (GPTQ, AWQ, compressed-tensors, qpack, GGUF)",
		Version: fmt.Sprintf("%s (commit %s)", version, commit()),
		Commands: []*cli.Command{
			batchCommand(),
			benchCommand(),
			convertCommand(),
			dequantizeCommand(),
			doctorCommand(),
			evalCommand(),
			exportCommand(),
			imatrixCommand(),
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
	os.Exit(exitCode(os.Args))
}

// exitCode runs the command line args and says what to exit with: 0, 1 for an error, or the
// code the command chose (batch: 1 a threshold failed, 2 a job failed to run).
func exitCode(args []string) int {
	app := newApp()
	err := app.Run(flagsFirst(app, args))
	if err == nil {
		return 0
	}
	var exit cli.ExitCoder
	if errors.As(err, &exit) {
		fmt.Fprintln(os.Stderr, err)
		return exit.ExitCode()
	}
	fmt.Fprintln(os.Stderr, "qpack:", err)
	return 1
}
