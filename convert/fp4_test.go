package convert

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
	"github.com/qpack-dev/qpack/safetensors"
)

// quantConfigOf reads the quantization_config of a converted checkpoint.
func quantConfigOf(t *testing.T, dir string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	q, _ := cfg["quantization_config"].(map[string]any)
	return q
}

// NVFP4 in compressed-tensors: the linears vLLM fuses (q, k, v; gate, up) share one global
// scale, that of their largest weight, and each module holds exactly what blockwise gives its
// weight under that scale; the config is the NVFP4A16 one. MXFP4 (no global scale) too.
func TestFP4CompressedTensors(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	in, err := safetensors.Open(tiny)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	for _, s := range []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme} {
		dir := filepath.Join(t.TempDir(), "out")
		opt := DefaultOptions()
		opt.Format, opt.Alloc, opt.Device = "compressed-tensors", Uniform(s), DeviceCPU
		if _, err := Convert(tiny, dir, opt); err != nil {
			t.Fatal(err)
		}
		if f := quantConfigOf(t, dir)["format"]; f != s.String()+"-pack-quantized" {
			t.Errorf("%s: config format %v", s, f)
		}
		ck, err := quantized.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		amax := func(names ...string) float32 {
			var m float32
			for _, n := range names {
				w, _ := in.Float32(n)
				for _, v := range w {
					m = max(m, v, -v)
				}
			}
			return m
		}
		attn, mlp := "model.layers.1.self_attn.", "model.layers.1.mlp."
		qkv := quant.NVFP4GlobalScale(amax(attn+"q_proj.weight", attn+"k_proj.weight", attn+"v_proj.weight"))
		gateUp := quant.NVFP4GlobalScale(amax(mlp+"gate_proj.weight", mlp+"up_proj.weight"))
		for module, g := range map[string]float32{attn + "q_proj": qkv, attn + "k_proj": qkv, attn + "v_proj": qkv,
			mlp + "gate_proj": gateUp, mlp + "up_proj": gateUp, mlp + "down_proj": quant.NVFP4GlobalScale(amax(mlp + "down_proj.weight"))} {
			if s.Grid == quant.MXFP4 {
				g = 0
			}
			got, err := ck.Unpack(module)
			if err != nil {
				t.Fatal(err)
			}
			if got.GlobalScale != g {
				t.Errorf("%s %s: global scale %v, want %v", s, module, got.GlobalScale, g)
			}
			w, _ := in.Float32(module + ".weight")
			want, err := blockwise.Quantize(w, got.N, got.K, s, blockwise.Options{GlobalScale: g})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Codes, want.Codes) || !slices.Equal(got.Scales, want.Scales) {
				t.Errorf("%s %s: stored tensor differs from blockwise's under the shared scale", s, module)
			}
		}
		ck.Close()
	}
}

// A block FP8 checkpoint written by qpack (format fp8) reads back as its dequantized weights:
// converting it to int4 gives exactly what RTN gives those weights, and its scales are not
// copied as tensors of their own.
func TestFP8BlockRoundTrip(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	fp8 := filepath.Join(t.TempDir(), "fp8")
	opt := DefaultOptions()
	opt.Format, opt.Alloc = "fp8", Uniform(quant.FP8BlockScheme(128))
	if _, err := Convert(tiny, fp8, opt); err != nil {
		t.Fatal(err)
	}
	if q := quantConfigOf(t, fp8); q["quant_method"] != "fp8" || q["weight_block_size"] == nil {
		t.Fatalf("quantization_config %v", q)
	}
	deq, err := quantized.OpenSource(fp8)
	if err != nil {
		t.Fatal(err)
	}
	defer deq.Close()
	int4 := filepath.Join(t.TempDir(), "int4")
	opt = DefaultOptions()
	opt.Format, opt.Device = "qpack", DeviceCPU
	if _, err := Convert(fp8, int4, opt); err != nil {
		t.Fatal(err)
	}
	out, err := quantized.Open(int4)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	for _, name := range out.Checkpoint.Names() {
		if strings.HasSuffix(name, "weight_scale_inv") {
			t.Errorf("the FP8 scales were copied: %s", name)
		}
	}
	module := "model.layers.2.mlp.down_proj"
	got, err := out.Unpack(module)
	if err != nil {
		t.Fatal(err)
	}
	w, err := deq.Float32(module + ".weight")
	if err != nil {
		t.Fatal(err)
	}
	want, err := blockwise.Quantize(w, got.N, got.K, DefaultScheme, blockwise.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Codes, want.Codes) || !slices.Equal(got.Scales, want.Scales) {
		t.Error("int4 from the FP8 checkpoint differs from RTN of its dequantized weights")
	}
}

// Format gptq cannot hold the FP4 grids; the refusal names the format that can.
func TestFP4RefusedByFormat(t *testing.T) {
	opt := DefaultOptions()
	opt.Alloc = Uniform(quant.NVFP4Scheme)
	_, err := Convert(testenv.Testdata(t, "models/tiny"), filepath.Join(t.TempDir(), "out"), opt)
	if err == nil || !strings.Contains(err.Error(), "format qpack") {
		t.Errorf("nvfp4 in format gptq: %v", err)
	}
}
