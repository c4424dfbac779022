// Command ptxgen compiles a CUDA C file to PTX with nvcc and writes it next to the source with
// a first line recording the source's SHA-256 (see cuda.CheckPTX). Packages with kernels run it
// from a go:generate line:
//
//	//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/convert.cu
//
// nvcc is $NVCC, else nvcc on PATH, else /usr/local/cuda/bin/nvcc.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/qpack-dev/qpack/cuda"
)

func main() {
	arch := flag.String("arch", "compute_80", "virtual architecture of the PTX (the oldest GPU it must run on)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: ptxgen [-arch compute_80] FILE.cu...")
		os.Exit(2)
	}
	for _, src := range flag.Args() {
		if err := generate(src, *arch); err != nil {
			fmt.Fprintln(os.Stderr, "ptxgen:", err)
			os.Exit(1)
		}
	}
}

func generate(srcPath, arch string) error {
	src, err := os.ReadFile(srcPath)
	if err != nil {
		return err
	}
	nvcc, err := findNVCC()
	if err != nil {
		return err
	}
	out := strings.TrimSuffix(srcPath, filepath.Ext(srcPath)) + ".ptx"
	tmp := out + ".tmp"
	args := []string{"-arch=" + arch, "-ptx"}
	cmd := exec.Command(nvcc, append(args, "-o", tmp, srcPath)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", nvcc, srcPath, err)
	}
	ptx, err := os.ReadFile(tmp)
	os.Remove(tmp)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	buf.WriteString(cuda.PTXHeader(filepath.Base(srcPath), src, strings.Join(args, " ")) + "\n")
	buf.Write(ptx)
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

func findNVCC() (string, error) {
	if p := os.Getenv("NVCC"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("nvcc"); err == nil {
		return p, nil
	}
	const fallback = "/usr/local/cuda/bin/nvcc"
	if _, err := os.Stat(fallback); err == nil {
		return fallback, nil
	}
	return "", fmt.Errorf("nvcc not found (set NVCC, or put the CUDA toolkit's bin on PATH)")
}
