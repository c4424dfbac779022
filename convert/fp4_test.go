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
// copied as tensors of their own. Searches on block FP8 are refused before any work.
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
	opt.Format, opt.Alloc, opt.Imatrix = "fp8", Uniform(quant.FP8BlockScheme(128)), true
	opt.Calib = CalibOptions{File: filepath.Join(t.TempDir(), "no-such-calib.txt")}
	if _, err := Convert(tiny, filepath.Join(t.TempDir(), "x"), opt); err == nil || !strings.Contains(err.Error(), "no clipping or imatrix search") {
		t.Errorf("block FP8 with --imatrix: %v", err)
	}
}

// The FP4 grids' refusals come before any work: AWQ cannot make them, GPTQ's act-order needs
// static groups with them, the gptq format cannot hold them.
func TestFP4RefusedBeforeAnyWork(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	missing := filepath.Join(t.TempDir(), "no-such-calib.txt")
	for _, c := range []struct {
		name string
		edit func(o *Options)
		want string
	}{
		{"nvfp4 under awq", func(o *Options) { o.Method, o.Format, o.Alloc = AWQ, "qpack", Uniform(quant.NVFP4Scheme) }, "awq quantizes to integer grids"},
		{"mxfp4 under act-order", func(o *Options) {
			o.Method, o.Format, o.Alloc, o.GPTQ.ActOrder = GPTQ, "qpack", Uniform(quant.MXFP4Scheme), true
		}, "--static-groups"},
		{"nvfp4 in the gptq format", func(o *Options) { o.Alloc, o.Calib = Uniform(quant.NVFP4Scheme), CalibOptions{} }, "format qpack"},
	} {
		opt := DefaultOptions()
		opt.Calib = CalibOptions{File: missing}
		c.edit(&opt)
		_, err := Convert(tiny, filepath.Join(t.TempDir(), "out"), opt)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "no-such-calib") {
			t.Errorf("%s: got %v, want %q before the calibration data is read", c.name, err, c.want)
		}
	}
}
