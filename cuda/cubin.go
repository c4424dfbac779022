package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/qpack-dev/qpack/internal/timeline"
)

// CubinHeaderPrefix starts every .cubin that ptxgen writes: one text line naming the GPU
// architecture and the SHA-256 of the PTX it was assembled from, then the machine code (ELF).
//
//	qpack-cubin arch=sm_90 ptx-sha256=<hex>
//
// A package ships a cubin next to its PTX so that GPUs of that architecture skip the driver's
// JIT compilation, which takes seconds for a large module on a machine's first run.
const CubinHeaderPrefix = "qpack-cubin "

// CubinHeader returns the header line (without newline) for a cubin of arch assembled from ptx.
func CubinHeader(arch string, ptx []byte) string {
	sum := sha256.Sum256(ptx)
	return fmt.Sprintf("%sarch=%s ptx-sha256=%s", CubinHeaderPrefix, arch, hex.EncodeToString(sum[:]))
}

// parseCubin splits a cubin file into its header fields and the ELF image.
func parseCubin(b []byte) (arch, ptxSHA string, image []byte, err error) {
	line, image, ok := bytes.Cut(b, []byte("\n"))
	if !ok || !bytes.HasPrefix(line, []byte(CubinHeaderPrefix)) {
		return "", "", nil, fmt.Errorf("cubin has no %q header line; regenerate it with go generate", strings.TrimSpace(CubinHeaderPrefix))
	}
	for _, f := range strings.Fields(strings.TrimPrefix(string(line), CubinHeaderPrefix)) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "arch":
			arch = v
		case "ptx-sha256":
			ptxSHA = v
		}
	}
	if arch == "" || ptxSHA == "" || !bytes.HasPrefix(image, []byte("\x7fELF")) {
		return "", "", nil, fmt.Errorf("cubin header %q: want arch, ptx-sha256 and an ELF image after it", line)
	}
	return arch, ptxSHA, image, nil
}

// CheckCubin reports an error when cubin was not assembled from ptx: a test of each package
// that ships cubins calls it, next to CheckPTX.
func CheckCubin(cubin, ptx []byte) error {
	arch, got, _, err := parseCubin(cubin)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(ptx)
	if want := hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("%s cubin is stale: assembled from PTX with sha256 %s, the PTX now has %s; run go generate on a machine with nvcc", arch, got, want)
	}
	return nil
}

// Arch is the device's architecture as cubins name it, e.g. sm_90.
func (i DeviceInfo) Arch() string { return fmt.Sprintf("sm_%d%d", i.ComputeMajor, i.ComputeMinor) }

// LoadModuleFor loads the cubin built for this GPU's architecture when one of cubins is, and
// otherwise, or when the driver refuses it, JIT-compiles ptx. Callers pass cubins assembled
// from ptx (CheckCubin), so either way the same kernels run.
func (d *Device) LoadModuleFor(ptx []byte, cubins ...[]byte) (*Module, error) {
	defer timeline.Begin(d.Info().Ordinal, "load kernels")()
	for _, c := range cubins {
		arch, _, image, err := parseCubin(c)
		if err != nil {
			return nil, err
		}
		if arch != d.info.Arch() {
			continue
		}
		if m, err := d.loadImage(image); err == nil {
			return m, nil
		}
	}
	return d.LoadModule(ptx)
}
