package quantized

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/packing"
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

// writeFP8Checkpoint writes a block FP8 checkpoint like DeepSeek-V3's: two linears of
// fp8-b32 (weight F8_E4M3 and weight_scale_inv F32) and a BF16 lm_head, with drop removed and
// replace substituted among the stored tensors. It returns the directory and the quantized
// tensors.
func writeFP8Checkpoint(t *testing.T, drop string, replace *packing.Raw) (string, map[string]*quant.Tensor) {
	t.Helper()
	dir := t.TempDir()
	cfg := `{"model_type": "llama", "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [32, 32]}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	mods := map[string]*quant.Tensor{}
	var tensors []safetensors.WriterTensor
	for name, shape := range map[string][2]int{"model.layers.0.mlp.up_proj": {70, 40}, "model.layers.0.mlp.down_proj": {40, 70}} {
		w := make([]float32, shape[0]*shape[1])
		for i := range w {
			w[i] = float32(r.NormFloat64())
		}
		q, err := blockwise.Quantize(w, shape[0], shape[1], quant.FP8BlockScheme(32), blockwise.Options{})
		if err != nil {
			t.Fatal(err)
		}
		mods[name] = q
		raws, err := packing.FP8Block{}.Pack(name, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, raw := range raws {
			if replace != nil && raw.Name == replace.Name {
				raw = *replace
			}
			if raw.Name != drop {
				tensors = append(tensors, safetensors.BytesTensor(raw.Name, safetensors.DType(raw.DType), raw.Shape, raw.Data))
			}
		}
	}
	tensors = append(tensors, safetensors.BytesTensor("lm_head.weight", safetensors.BF16, []int{4, 40}, make([]byte, 2*4*40)))
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return dir, mods
}

// A block FP8 checkpoint reads as plain weights: each weight times its block's scale.
func TestFP8BlockCheckpointAsWeights(t *testing.T) {
	dir, mods := writeFP8Checkpoint(t, "", nil)
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Format == nil || c.Format.Name() != "fp8" || len(c.Modules()) != 2 {
		t.Fatalf("format %v, modules %v", c.Format, c.Modules())
	}
	if want := []string{"lm_head.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"}; !slices.Equal(c.Names(), want) {
		t.Errorf("names %v, want %v", c.Names(), want)
	}
	for prefix, q := range mods {
		got, err := c.Float32(prefix + ".weight")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, q.Dequantize(nil)) {
			t.Errorf("%s: dequantized weights differ", prefix)
		}
		if shape, ok := c.Shape(prefix + ".weight"); !ok || shape[0] != q.N || shape[1] != q.K {
			t.Errorf("%s: shape %v", prefix, shape)
		}
	}
}

// A missing or mis-shaped block scale is an error naming the tensor, not weights off by a scale.
func TestFP8BlockCheckpointBadScales(t *testing.T) {
	dir, _ := writeFP8Checkpoint(t, "model.layers.0.mlp.up_proj.weight_scale_inv", nil)
	if c, err := Open(dir); err == nil || !strings.Contains(err.Error(), "model.layers.0.mlp.up_proj.weight_scale_inv") {
		if c != nil {
			c.Close()
		}
		t.Errorf("missing scale: %v", err)
	}
	bad := packing.Raw{Name: "model.layers.0.mlp.down_proj.weight_scale_inv", DType: "F32", Shape: []int{2, 2}, Data: make([]byte, 16)}
	dir, _ = writeFP8Checkpoint(t, "", &bad)
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Float32("model.layers.0.mlp.down_proj.weight"); err == nil || !strings.Contains(err.Error(), bad.Name) || !strings.Contains(err.Error(), "[2 3]") {
		t.Errorf("mis-shaped scale: %v", err)
	}
}

// OpenSource reads a block FP8 release as F32 weights (what convert quantizes), its scales out
// of the names; mis-shaped scales are refused when it opens, naming the tensor.
func TestOpenSourceFP8(t *testing.T) {
	dir, mods := writeFP8Checkpoint(t, "", nil)
	ck, err := OpenSource(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if want := []string{"lm_head.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"}; !slices.Equal(ck.Names(), want) {
		t.Errorf("names %v, want %v", ck.Names(), want)
	}
	for prefix, q := range mods {
		info, _ := ck.Info(prefix + ".weight")
		if info.DType != safetensors.F32 || info.Size != int64(4*q.N*q.K) {
			t.Errorf("%s: info %+v", prefix, info)
		}
		w, err := ck.Float32(prefix + ".weight")
		if err != nil || !slices.Equal(w, q.Dequantize(nil)) {
			t.Errorf("%s: %v, or the weights differ from the dequantization", prefix, err)
		}
	}
	bad := packing.Raw{Name: "model.layers.0.mlp.up_proj.weight_scale_inv", DType: "F32", Shape: []int{3, 1}, Data: make([]byte, 12)}
	dir, _ = writeFP8Checkpoint(t, "", &bad)
	if ck, err := OpenSource(dir); err == nil || !strings.Contains(err.Error(), bad.Name) || !strings.Contains(err.Error(), "F32[3 2]") {
		if ck != nil {
			ck.Close()
		}
		t.Errorf("mis-shaped scale: %v", err)
	}
	plain, err := OpenSource(testenv.Testdata(t, "models/tiny"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if info, _ := plain.Info("model.layers.0.mlp.up_proj.weight"); info.DType != safetensors.F32 || len(plain.Names()) != 39 {
		t.Errorf("a plain checkpoint reads differently: %+v, %d names", info, len(plain.Names()))
	}
}
