package quantized

import (
	"path/filepath"
	"testing"

	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// AutoGPTQ's own files read as plain weights: block 0 dequantizes to what AutoGPTQ's
// reader produced, exactly once rounded to F16 (AutoGPTQ multiplies in F16; we in float32).
func TestGoldenGPTQAsWeights(t *testing.T) {
	dir := testenv.Testdata(t, "golden/gptq-w4g128-asym")
	c, err := Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Format == nil || c.Format.Name() != "gptq" || len(c.Modules()) != 28 {
		t.Fatalf("format %v, %d modules", c.Format, len(c.Modules()))
	}
	want, err := safetensors.Open(filepath.Join(dir, "dequantized-block0.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	for _, name := range want.Names() {
		shape, ok := c.Shape(name)
		info, _ := want.Info(name)
		if !ok || shape[0] != info.Shape[0] || shape[1] != info.Shape[1] {
			t.Fatalf("%s: shape %v, want %v", name, shape, info.Shape)
		}
		got, err := c.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		ref, _ := want.Float32(name)
		for i := range ref {
			if quant.RoundF16(got[i]) != ref[i] {
				t.Fatalf("%s[%d] = %v, AutoGPTQ says %v", name, i, got[i], ref[i])
			}
		}
	}
	m, err := c.Module("model.layers.0.mlp.down_proj")
	if err != nil || m.N != 128 || m.K != 384 || m.Scheme.String() != "int4-g128-asym" || len(m.Stored) != 4 {
		t.Errorf("module info %+v, %v", m, err)
	}
	names := c.Names()
	for _, n := range names {
		if _, owned := c.Owner(n); owned {
			t.Errorf("stored tensor %s listed among the logical names", n)
		}
	}
}

// A plain checkpoint opens with no format and reads as itself.
func TestPlainCheckpoint(t *testing.T) {
	c, err := Open(testenv.Testdata(t, "models/tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Format != nil || len(c.Modules()) != 0 || len(c.Names()) != 39 {
		t.Errorf("format %v, %d modules, %d names", c.Format, len(c.Modules()), len(c.Names()))
	}
	if _, err := c.Unpack("model.layers.0.mlp.up_proj"); err == nil {
		t.Errorf("Unpack of a plain tensor should fail")
	}
}
