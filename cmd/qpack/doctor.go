package main

import (
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/blas"
	"github.com/qpack-dev/qpack/cuda"
)

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name: "doctor",
		Usage: "report the machine: qpack version, CPU cores, the CPU matrix path (SIMD kernel, threads, OpenBLAS, measured GFLOP/s), " +
			"NVIDIA driver, GPUs with memory, and the CUDA math libraries found",
		Action: func(c *cli.Context) error {
			w := c.App.Writer
			fmt.Fprintf(w, "qpack %s (commit %s), %s/%s, %d CPU cores\n", version, commit(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
			describeCPUPath(w)
			fmt.Fprint(w, cuda.Describe().String())
			fmt.Fprintf(w, "library search: $%s, then %v\n", cuda.LibraryDirEnv, cuda.LibrarySearchDirs())
			return nil
		},
	}
}

// describeCPUPath prints the CPU matrix path: the engine and kernel, why, OpenBLAS found or
// not, and a short measurement.
func describeCPUPath(w io.Writer) {
	p := blas.Current()
	engine := "Go engine, " + p.Kernel + " kernel"
	if p.UseOpenBLAS {
		engine = "OpenBLAS " + p.Library
	}
	fmt.Fprintf(w, "CPU matrix products: %s, %d threads (%s)\n", engine, blas.Threads(), p.Reason)
	switch lib, ok := blas.Available(); {
	case ok:
		fmt.Fprintf(w, "OpenBLAS: found as %s, used: %v (%s=openblas or %s=go chooses)\n", lib, p.UseOpenBLAS, blas.Setting, blas.Setting)
	case p.SIMD:
		fmt.Fprintf(w, "OpenBLAS: not needed with a SIMD kernel; %v\n", blas.LoadErr())
	default:
		fmt.Fprintf(w, "OpenBLAS: %v; installing it (Debian: libopenblas0-pthread) speeds up matrix products on this CPU\n", blas.LoadErr())
	}
	fmt.Fprintf(w, "CPU matrix speed: %.1f GFLOP/s (best 512×512×512 product over 0.2 s)\n", blas.Measure(200*time.Millisecond))
	if note := p.SlowNote(); note != "" {
		fmt.Fprintln(w, note)
	}
}

var slowNoteOnce sync.Once

// noteSlowPath tells, once per process, that matrix products run in portable Go (no SIMD kernel
// for this CPU and no OpenBLAS): for the commands that run forward passes.
func noteSlowPath(w io.Writer) {
	slowNoteOnce.Do(func() {
		if note := blas.Current().SlowNote(); note != "" {
			fmt.Fprintln(w, note)
		}
	})
}
