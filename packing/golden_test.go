package packing

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// checkpointGetter serves a safetensors checkpoint's tensors to Unpack.
func checkpointGetter(t *testing.T, c *safetensors.Checkpoint) func(string) (Raw, bool) {
	return func(name string) (Raw, bool) {
		info, ok := c.Info(name)
		if !ok {
			return Raw{}, false
		}
		data, err := c.Bytes(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return Raw{Name: name, DType: string(info.DType), Shape: info.Shape, Data: data}, true
	}
}

// TestAutoGPTQGolden reads checkpoints written by AutoGPTQ's own packer (testdata/golden):
// every linear must unpack, dequantize exactly to AutoGPTQ's own F16 reconstruction of block 0,
// and pack again into the very same words.
func TestAutoGPTQGolden(t *testing.T) {
	dirs, _ := filepath.Glob("../testdata/golden/gptq-*")
	if len(dirs) == 0 {
		t.Skip("no golden GPTQ files in ../testdata/golden")
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) { checkGolden(t, dir) })
	}
}

func checkGolden(t *testing.T, dir string) {
	cfgJSON, err := os.ReadFile(filepath.Join(dir, "quantize_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig(cfgJSON)
	if err != nil {
		t.Fatal(err)
	}
	model, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	deq, err := safetensors.Open(filepath.Join(dir, "dequantized-block0.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer deq.Close()

	f, err := Detect(model.Names(), cfgJSON)
	if err != nil {
		t.Fatal(err)
	}
	if f.Name() != "gptq" {
		t.Fatalf("detected %s", f.Name())
	}
	get := checkpointGetter(t, model)
	linears, compared := 0, 0
	for _, name := range model.Names() {
		prefix, ok := strings.CutSuffix(name, ".qweight")
		if !ok {
			continue
		}
		linears++
		x, err := f.Unpack(prefix, get, cfg.Meta())
		if err != nil {
			t.Fatal(err)
		}
		if want, err := deq.Float32(prefix + ".weight"); err == nil {
			compareDequantized(t, prefix, x, want)
			compared++
		}
		repacked, err := f.Pack(prefix, x)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range repacked {
			orig, err := model.Bytes(r.Name)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(r.Data, orig) {
				t.Errorf("%s: repacked bytes differ from AutoGPTQ's", r.Name)
			}
		}
	}
	if linears == 0 || compared != 7 {
		t.Fatalf("%d packed linears, %d compared with the dequantized block (want 7)", linears, compared)
	}
}

// compareDequantized checks scale·(q − z), rounded to F16 as AutoGPTQ's half-precision
// reader computes it, against AutoGPTQ's output, bit for bit.
func compareDequantized(t *testing.T, prefix string, x *quant.Tensor, want []float32) {
	t.Helper()
	if len(want) != x.N*x.K {
		t.Fatalf("%s: %d dequantized values for %dx%d", prefix, len(want), x.N, x.K)
	}
	ng := x.Scheme.Groups(x.K)
	got := x.Dequantize(nil)
	for i, w := range want {
		n, k := i/x.K, i%x.K
		g := x.Group(k)
		// the formula by hand, independent of quant.Dequantize
		byHand := x.Scales[n*ng+g] * float32(int(x.Codes[i])-int(x.Zeros[n*ng+g]))
		if quant.RoundF16(byHand) != w || quant.RoundF16(got[i]) != w {
			t.Fatalf("%s[%d][%d]: scale·(q−z) = %g (Dequantize %g), AutoGPTQ %g", prefix, n, k, byHand, got[i], w)
		}
	}
}
