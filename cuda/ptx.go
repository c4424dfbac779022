package cuda

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// PTXHeaderPrefix starts the first line of every .ptx that ptxgen writes; the line records
// the SHA-256 of the .cu source it was compiled from:
//
//	// qpack-ptx source=convert.cu sha256=<hex> nvcc=-arch=compute_80 -ptx
const PTXHeaderPrefix = "// qpack-ptx "

// PTXHeader returns the header line (without newline) for PTX compiled from src.
func PTXHeader(srcName string, src []byte, nvccFlags string) string {
	sum := sha256.Sum256(src)
	return fmt.Sprintf("%ssource=%s sha256=%s nvcc=%s", PTXHeaderPrefix, srcName, hex.EncodeToString(sum[:]), nvccFlags)
}

// CheckPTX reports an error when ptx was not compiled from src, by the hash in its header:
// a test of each package with kernels calls it so that a .cu edited without `go generate`
// fails CI.
func CheckPTX(ptx, src []byte) error {
	first, _, _ := bytes.Cut(ptx, []byte("\n"))
	line := string(first)
	if !strings.HasPrefix(line, PTXHeaderPrefix) {
		return fmt.Errorf("PTX has no %q header line; regenerate it with go generate", strings.TrimSpace(PTXHeaderPrefix))
	}
	fields := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(strings.TrimPrefix(line, PTXHeaderPrefix)))
	sc.Split(bufio.ScanWords)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			if _, seen := fields[k]; !seen {
				fields[k] = v
			}
		}
	}
	sum := sha256.Sum256(src)
	if want := hex.EncodeToString(sum[:]); fields["sha256"] != want {
		return fmt.Errorf("PTX is stale: compiled from %s with sha256 %s, source now has %s; run go generate on a machine with nvcc",
			fields["source"], fields["sha256"], want)
	}
	return nil
}
