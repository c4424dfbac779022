package cuda

import (
	"strings"
	"testing"
)

func TestCheckCubin(t *testing.T) {
	ptx := []byte("// some ptx\n.version 8.0\n")
	good := []byte(CubinHeader("sm_90", ptx) + "\n\x7fELF rest of the image")
	if err := CheckCubin(good, ptx); err != nil {
		t.Errorf("matching cubin: %v", err)
	}
	if err := CheckCubin(good, append(ptx, ' ')); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Errorf("cubin of other PTX: got %v", err)
	}
	for name, bad := range map[string][]byte{
		"no header":  []byte("\x7fELF"),
		"no ELF":     []byte(CubinHeader("sm_90", ptx) + "\nnot an image"),
		"no arch":    []byte(CubinHeaderPrefix + "ptx-sha256=ab\n\x7fELF"),
		"empty file": nil,
	} {
		if err := CheckCubin(bad, ptx); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// LoadModuleFor skips cubins of other architectures and falls back to the PTX when the driver
// refuses the cubin for this one; either way the kernels are there.
func TestLoadModuleForFallsBackToPTX(t *testing.T) {
	d := openTestDevice(t)
	ptx := []byte(probePTX)
	other := []byte(CubinHeader("sm_10", ptx) + "\n\x7fELF")
	broken := []byte(CubinHeader(d.Info().Arch(), ptx) + "\n\x7fELF not really an image")
	m, err := d.LoadModuleFor(ptx, other, broken)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	if _, err := m.Function("probe"); err != nil {
		t.Error(err)
	}
	if _, err := d.LoadModuleFor(ptx, []byte("garbage")); err == nil {
		t.Error("a cubin without header was accepted")
	}
}
