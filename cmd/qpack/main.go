// Command qpack converts Hugging Face checkpoints into quantized, bit-packed checkpoints and
// inspects, evaluates and verifies them. This file only wires flags to the packages.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"runtime/pprof"

	"github.com/qpack-dev/qpack/internal/timeline"
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
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a Go CPU profile of the command to this file (go tool pprof reads it): where a slow run spends its host time"},
			&cli.StringFlag{Name: "trace", Usage: "write a timeline of the command's phases on the host and on each GPU to this file (Chrome trace-event JSON: chrome://tracing or ui.perfetto.dev)"},
		},
		Before: startProfile,
		After:  stopProfile,
		// Errors are printed once, by main, with exit code 1.
		ExitErrHandler: func(*cli.Context, error) {},
	}
}

// startProfile starts the CPU profile --cpuprofile asks for and the timeline --trace asks for.
func startProfile(c *cli.Context) error {
	if c.String("trace") != "" {
		recording = timeline.Start()
	}
	path := c.String("cpuprofile")
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("--cpuprofile: %w", err)
	}
	profileFile = f
	return nil
}

var (
	profileFile *os.File            // the running --cpuprofile
	recording   *timeline.Recording // the running --trace
)

func stopProfile(c *cli.Context) error {
	var errs []error
	if recording != nil {
		recording.Stop()
		if err := recording.WriteFile(c.String("trace")); err != nil {
			errs = append(errs, fmt.Errorf("--trace: %w", err))
		}
		recording = nil
	}
	if profileFile != nil {
		pprof.StopCPUProfile()
		errs = append(errs, profileFile.Close())
		profileFile = nil
	}
	return errors.Join(errs...)
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
