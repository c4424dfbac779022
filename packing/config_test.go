package packing

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// sameJSON compares a built config with a literal from docs/reference/formats.md, as JSON values.
func sameJSON(t *testing.T, got map[string]any, literal string) {
	t.Helper()
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var g, w any
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(literal), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("config\n got %s\nwant %s", b, literal)
	}
}

func TestConfigsMatchReference(t *testing.T) {
	int4sym := quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 128, Sym: true}
	int4asym := quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 128}
	// docs/reference/formats.md §1.7, "Recommended minimal config".
	g, err := QuantizationConfig(Config{Format: "gptq", Scheme: int4sym, Ignore: []string{"lm_head"}})
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, g, `{"quant_method":"gptq","bits":4,"group_size":128,"desc_act":false,"sym":true,
		"damp_percent":0.01,"true_sequential":true,"static_groups":false,
		"checkpoint_format":"gptq","lm_head":false,"pack_dtype":"int32",
		"model_name_or_path":null,"model_file_base_name":"model"}`)
	// docs/reference/formats.md §2.3.
	a, err := QuantizationConfig(Config{Format: "awq", Scheme: int4asym})
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, a, `{"quant_method":"awq","zero_point":true,"group_size":128,"bits":4,"version":"gemm","modules_to_not_convert":null}`)
	// docs/reference/formats.md §3.4.
	c, err := QuantizationConfig(Config{Format: "compressed-tensors", Scheme: int4sym, Ignore: []string{"lm_head"}})
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, c, `{
  "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
  "global_compression_ratio": null, "ignore": ["lm_head"], "kv_cache_scheme": null,
  "sparsity_config": {}, "transform_config": {}, "version": "0.12.2",
  "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized",
      "input_activations": null, "output_activations": null,
      "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128,
        "block_structure": null, "dynamic": false, "actorder": null, "observer": "minmax", "observer_kwargs": {}}}}}`)
}

// The FP4 configs are compressed-tensors' NVFP4A16 and MXFP4A16 presets (quant_scheme.py) in the
// serialised form of §3.4, and the FP8 one what DeepSeek-V3 and Qwen3-FP8 ship (docs/fp4.md).
func TestMicroscaledConfigs(t *testing.T) {
	nv, err := QuantizationConfig(Config{Format: "compressed-tensors", Scheme: quant.NVFP4Scheme, Ignore: []string{"lm_head"}})
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, nv, `{
  "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "quantization_status": "compressed",
  "global_compression_ratio": null, "ignore": ["lm_head"], "kv_cache_scheme": null,
  "sparsity_config": {}, "transform_config": {}, "version": "0.12.2",
  "config_groups": {"group_0": {"targets": ["Linear"], "format": "nvfp4-pack-quantized",
      "input_activations": null, "output_activations": null,
      "weights": {"num_bits": 4, "type": "float", "symmetric": true, "strategy": "tensor_group", "group_size": 16,
        "block_structure": null, "dynamic": false, "actorder": null, "observer": "minmax", "observer_kwargs": {}}}}}`)
	mx, err := QuantizationConfig(Config{Format: "compressed-tensors", Scheme: quant.MXFP4Scheme})
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, mx, `{
  "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "quantization_status": "compressed",
  "global_compression_ratio": null, "ignore": [], "kv_cache_scheme": null,
  "sparsity_config": {}, "transform_config": {}, "version": "0.14.0",
  "config_groups": {"group_0": {"targets": ["Linear"], "format": "mxfp4-pack-quantized",
      "input_activations": null, "output_activations": null,
      "weights": {"num_bits": 4, "type": "float", "symmetric": true, "strategy": "group", "group_size": 32,
        "block_structure": null, "dynamic": false, "actorder": null, "observer": "minmax", "observer_kwargs": {}}}}}`)
	f8, err := QuantizationConfig(Config{Format: "fp8", Scheme: quant.FP8BlockScheme(128)})
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, f8, `{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}`)
	// DeepSeek-V3's config.json quantization_config and Qwen3-8B-FP8's, as published.
	for _, c := range []string{
		`{"quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}}`,
		`{"quantization_config": {"activation_scheme": "dynamic", "modules_to_not_convert": null, "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}}`,
	} {
		cfg, err := ParseConfig([]byte(c))
		if err != nil || cfg.Format != "fp8" || cfg.Scheme != quant.FP8BlockScheme(128) {
			t.Errorf("%s: %+v, %v", c, cfg, err)
		}
	}
	for _, c := range []string{
		`{"quant_method": "fp8", "activation_scheme": "static"}`,
		`{"quant_method": "fp8", "weight_block_size": [128, 64]}`,
		`{"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e5m2"}`,
		`{"quant_method": "compressed-tensors", "config_groups": {"g": {"format": "nvfp4-pack-quantized", "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 32}}}}`,
		`{"quant_method": "compressed-tensors", "config_groups": {"g": {"format": "pack-quantized", "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}}}`,
	} {
		if cfg, err := ParseConfig([]byte(c)); err == nil {
			t.Errorf("%s: accepted as %+v", c, cfg)
		}
	}
}

func TestConfigRoundTrip(t *testing.T) {
	pc := quant.PerChannel
	cases := []Config{
		{Format: "gptq", Scheme: quant.Scheme{Grid: quant.Integer, Bits: 3, GroupSize: 64}, DescAct: true},
		{Format: "gptq_v2", Scheme: quant.Scheme{Grid: quant.Integer, Bits: 2, GroupSize: pc}, LMHead: true},
		{Format: "gptq", Scheme: quant.Scheme{Grid: quant.Integer, Bits: 8, GroupSize: 32, Sym: true}},
		{Format: "awq", Scheme: quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 64}, Ignore: []string{"lm_head", "model.layers.0.mlp.down_proj"}},
		{Format: "compressed-tensors", Scheme: quant.Scheme{Grid: quant.Integer, Bits: 8, GroupSize: pc}, Ignore: []string{"lm_head"}},
		{Format: "compressed-tensors", Scheme: quant.Scheme{Grid: quant.Integer, Bits: 2, GroupSize: 32}, DescAct: true, Ignore: []string{}},
		{Format: "qpack", Scheme: quant.Scheme{Grid: quant.Binary, Bits: 1, GroupSize: 128}, Ignore: []string{"lm_head"}},
		{Format: "compressed-tensors", Scheme: quant.NVFP4Scheme, Ignore: []string{"lm_head"}},
		{Format: "compressed-tensors", Scheme: quant.MXFP4Scheme},
		{Format: "fp8", Scheme: quant.FP8BlockScheme(128)},
		{Format: "fp8", Scheme: quant.FP8BlockScheme(64), Ignore: []string{"model.layers.0.mlp.down_proj"}},
		{Format: "qpack", Scheme: quant.NVFP4Scheme},
	}
	for _, want := range cases {
		q, err := QuantizationConfig(want)
		if err != nil {
			t.Fatalf("%+v: %v", want, err)
		}
		b, err := json.Marshal(map[string]any{"model_type": "llama", "quantization_config": q})
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseConfig(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if strings.HasPrefix(want.Format, "gptq") {
			got.Ignore = want.Ignore // GPTQ records exclusions only as "dynamic" patterns
		}
		if len(want.Ignore) == 0 && len(got.Ignore) == 0 {
			got.Ignore = want.Ignore
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("round trip of %s\n got %+v\nwant %+v", b, got, want)
		}
	}
}

func TestGPTQConfigExcludesIgnoredModules(t *testing.T) {
	q, err := QuantizationConfig(Config{Format: "gptq", Scheme: quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 128, Sym: true},
		Ignore: []string{"lm_head", "model.layers.0.mlp.down_proj"}})
	if err != nil {
		t.Fatal(err)
	}
	dyn, _ := q["dynamic"].(map[string]any)
	if len(dyn) != 1 || dyn[`-:^model\.layers\.0\.mlp\.down_proj$`] == nil {
		t.Fatalf("dynamic = %v", q["dynamic"])
	}
}

func TestParseConfigVariants(t *testing.T) {
	golden, err := os.ReadFile("../testdata/golden/gptq-w4g128-asym/config.json")
	if err == nil {
		c, err := ParseConfig(golden)
		if err != nil || c.Format != "gptq" || c.Scheme.String() != "int4-g128-asym" {
			t.Errorf("golden config.json: %+v, %v", c, err)
		}
	}
	ok := map[string]string{ // config → format/scheme
		`{"bits":4,"group_size":-1,"desc_act":false}`:                                                          "gptq/int4-pc-sym",
		`{"quant_method":"gptq","bits":4,"group_size":128,"sym":false,"format":"gptq_v2"}`:                     "gptq_v2/int4-g128-asym",
		`{"quant_method":"awq","w_bit":4,"q_group_size":64,"zero_point":true,"version":"GEMM"}`:                "awq/int4-g64-asym",
		`{"quantization_config":{"quant_method":"qpack","version":1,"scheme":"nf4-g64","ignore":["lm_head"]}}`: "qpack/nf4-g64",
	}
	for in, want := range ok {
		c, err := ParseConfig([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got := c.Format + "/" + c.Scheme.String(); got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	bad := map[string]string{
		`{"quant_method":"bitsandbytes"}`: "not supported",
		`{"model_type":"llama"}`:          "no quant_method",
		`{"quant_method":"gptq","bits":4,"group_size":128,"is_marlin_format":true}`:                                                                            "Marlin",
		`{"quant_method":"gptq","bits":5,"group_size":128}`:                                                                                                    "2, 3, 4 or 8",
		`{"quant_method":"gptq","group_size":128}`:                                                                                                             "bits is missing",
		`{"quant_method":"gptq","bits":4,"group_size":128,"checkpoint_format":"marlin"}`:                                                                       "checkpoint_format",
		`{"quant_method":"awq","bits":4,"group_size":128,"zero_point":true,"version":"gemv"}`:                                                                  "GEMM",
		`{"quant_method":"awq","bits":4,"group_size":128}`:                                                                                                     "zero_point",
		`{"quant_method":"compressed-tensors","format":"int-quantized","config_groups":{"g":{"weights":{"num_bits":8,"type":"int","strategy":"channel"}}}}`:    "pack-quantized",
		`{"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":{"g":{"weights":{"num_bits":8,"type":"float","strategy":"channel"}}}}`: "type",
		`{"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":{
			"a":{"weights":{"num_bits":8,"type":"int","strategy":"channel"}},
			"b":{"weights":{"num_bits":4,"type":"int","strategy":"group","group_size":128}}}}`: "different",
		`not json`: "quantization config",
	}
	for in, want := range bad {
		_, err := ParseConfig([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one mentioning %q", in, err, want)
		}
	}
}

func TestQuantizationConfigRefusesUnfitSchemes(t *testing.T) {
	if _, err := QuantizationConfig(Config{Format: "gptq", Scheme: quant.Scheme{Grid: quant.NF4, Bits: 4, GroupSize: 64, Sym: true}}); err == nil {
		t.Error("gptq config for nf4")
	}
	if _, err := QuantizationConfig(Config{Format: "awq", Scheme: quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 64}, DescAct: true}); err == nil {
		t.Error("awq config with act-order")
	}
}

func TestDetect(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	x := randomTensor(rng, quant.Scheme{Grid: quant.Integer, Bits: 4, GroupSize: 32}, 8, 64, false)
	namesOf := func(f Format) []string {
		raws, err := f.Pack("model.layers.0.mlp.up_proj", x)
		if err != nil {
			t.Fatal(err)
		}
		names := []string{"model.embed_tokens.weight", "model.norm.weight"}
		for _, r := range raws {
			names = append(names, r.Name)
		}
		return names
	}
	for _, name := range []string{"gptq", "awq", "compressed-tensors", "qpack"} {
		f, _ := Lookup(name)
		got, err := Detect(namesOf(f), nil)
		if err != nil || got.Name() != name {
			t.Errorf("names of %s detected as %v (%v)", name, got, err)
		}
	}
	v2cfg := []byte(`{"quant_method":"gptq","bits":4,"group_size":32,"sym":false,"checkpoint_format":"gptq_v2"}`)
	if got, err := Detect(namesOf(GPTQ{V2: true}), v2cfg); err != nil || got.Name() != "gptq_v2" {
		t.Errorf("gptq_v2 config detected as %v (%v)", got, err)
	}
	if _, err := Detect(namesOf(QPack{}), v2cfg); err == nil || !strings.Contains(err.Error(), "qpack") {
		t.Errorf("contradicting config and names: %v", err)
	}
	if _, err := Detect([]string{"model.norm.weight"}, nil); err == nil {
		t.Error("an unquantized checkpoint was detected as quantized")
	}
}
