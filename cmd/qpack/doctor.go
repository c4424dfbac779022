package main

import (
	"fmt"
	"runtime"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/cuda"
)

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "report the machine: qpack version, CPU cores, NVIDIA driver, GPUs with memory, and the CUDA math libraries found",
		Action: func(c *cli.Context) error {
			fmt.Fprintf(c.App.Writer, "qpack %s (commit %s), %s/%s, %d CPU cores\n", version, commit(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
			fmt.Fprint(c.App.Writer, cuda.Describe().String())
			fmt.Fprintf(c.App.Writer, "library search: $%s, then %v\n", cuda.LibraryDirEnv, cuda.LibrarySearchDirs())
			return nil
		},
	}
}
