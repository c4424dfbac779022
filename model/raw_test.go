package model

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/safetensors"
)

// tinyAs writes the tiny model with every tensor stored as d into a temporary directory, with
// its config; bad, when not "", names a tensor that gets a NaN at index 5.
func tinyAs(t testing.TB, d safetensors.DType, bad string) string {
	t.Helper()
	dir := t.TempDir()
	cfg, err := os.ReadFile(filepath.Join(tinyDir, "config.json"))
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	in, err := safetensors.Open(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var ts []safetensors.WriterTensor
	for _, name := range in.Names() {
		v, err := in.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == bad {
			v[5] = float32(math.NaN())
		}
		shape, _ := in.Shape(name)
		ts = append(ts, safetensors.BytesTensor(name, d, shape, safetensors.EncodeFloat32(d, v)))
	}
	if _, err := safetensors.WriteCheckpoint(dir, ts, nil, 0); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRawLinears: a block that SetRawLinears names keeps its projections' weights as the
// checkpoint stores them (no float32 W), the bytes whose values the float32 read gives, for BF16,
// F16 and F32 checkpoints; its norms and the other blocks are read as before; a non-finite F32
// weight is an error naming the tensor, as in a float32 read (BF16 and F16 ones are found where
// the GPU widens them: TestGPURawUploads).
func TestRawLinears(t *testing.T) {
	for _, d := range []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32} {
		dir := tinyAs(t, d, "")
		ref, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		m.SetRawLinears(func(block int) bool { return block == 0 })
		raw, err := m.Block(0)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ref.Block(0)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range raw.AllLinears() {
			w := want.AllLinears()[i]
			if l.W != nil || l.raw.dtype != d {
				t.Fatalf("%s: %s read with W (%d values) and raw type %q", d, l.Name, len(l.W), l.raw.dtype)
			}
			got := make([]float32, l.Out*l.In)
			if err := safetensors.DecodeFloat32(d, got, l.raw.data); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, w.W) || !slices.Equal(l.Bias, w.Bias) {
				t.Errorf("%s: %s's raw bytes do not hold its float32 weights", d, l.Name)
			}
		}
		if !slices.Equal(raw.InputNorm, want.InputNorm) || !slices.Equal(raw.PostAttnNorm, want.PostAttnNorm) {
			t.Errorf("%s: block 0's norms differ", d)
		}
		other, err := m.Block(1)
		if err != nil {
			t.Fatal(err)
		}
		if other.Q.W == nil || other.Q.raw.data != nil {
			t.Errorf("%s: block 1, not named, read raw", d)
		}
		raw.releaseRaw() // its pages come back from the page cache
		if got := make([]float32, raw.Q.Out*raw.Q.In); safetensors.DecodeFloat32(d, got, raw.Q.raw.data) != nil || !slices.Equal(got, want.Q.W) {
			t.Errorf("%s: q_proj's bytes changed after their pages were released", d)
		}
		m.Close()
		ref.Close()
	}
	bad := "model.layers.0.mlp.down_proj.weight"
	m, err := Open(tinyAs(t, safetensors.F32, bad))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.SetRawLinears(func(int) bool { return true })
	if _, err := m.Block(0); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "non-finite") {
		t.Errorf("a NaN in %s read raw: %v", bad, err)
	}
}
