// Command ptxgen compiles a CUDA C file to PTX with nvcc and writes it next to the source with
// a first line recording the source's SHA-256 (see cuda.CheckPTX). Packages with kernels run it
// from a go:generate line:
//
//	//go:generate go run github.com/qpack-dev/qpack/cuda/ptxgen kernels/convert.cu
//
// A source with a line "// qpack-cubin: sm_90 ..." also gets machine code for those
// architectures, assembled from the PTX by ptxas (NAME.sm_90.cubin, see cuda.CubinHeader).
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
	args := []string{"-arch=" + arch, "-ptx"}
	ptx, err := runTool(nvcc, args, srcPath)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	buf.WriteString(cuda.PTXHeader(filepath.Base(srcPath), src, strings.Join(args, " ")) + "\n")
	buf.Write(ptx)
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	for _, arch := range cubinArchs(src) {
		if err := assemble(nvcc, out, buf.Bytes(), arch); err != nil {
			return err
		}
	}
	return nil
}

// cubinArchs reads the architectures a source asks cubins for, from a line such as
//
//	// qpack-cubin: sm_90
func cubinArchs(src []byte) []string {
	for _, line := range strings.Split(string(src), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "// qpack-cubin:"); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}

// assemble turns the written PTX into machine code for arch with ptxas (beside nvcc) and
// writes it, with cuda.CubinHeader, next to the PTX as NAME.ARCH.cubin.
func assemble(nvcc, ptxPath string, ptx []byte, arch string) error {
	out := strings.TrimSuffix(ptxPath, ".ptx") + "." + arch + ".cubin"
	elf, err := runTool(filepath.Join(filepath.Dir(nvcc), "ptxas"), []string{"-arch=" + arch}, ptxPath)
	if err != nil {
		return err
	}
	return os.WriteFile(out, append([]byte(cuda.CubinHeader(arch, ptx)+"\n"), elf...), 0o644)
}

// runTool runs `tool args... -o TMP input` and returns what it wrote to TMP.
func runTool(tool string, args []string, input string) ([]byte, error) {
	tmp, err := os.CreateTemp("", "ptxgen-*")
	if err != nil {
		return nil, err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command(tool, append(args, "-o", tmp.Name(), input)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", tool, input, err)
	}
	return os.ReadFile(tmp.Name())
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
