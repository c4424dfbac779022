package packing

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/qpack-dev/qpack/quant"
)

// Config is what a checkpoint's quantization config says: the layout and the scheme of its
// quantized linears.
type Config struct {
	Format  string       // a registry name: "gptq", "gptq_v2", "awq", "compressed-tensors", "qpack"
	Scheme  quant.Scheme // the scheme of the quantized linears (qpack: the default; tensors may differ)
	DescAct bool         // act-order: g_idx may be non-trivial
	Ignore  []string     // full names of linear modules left unquantized (e.g. "lm_head")
	LMHead  bool         // gptq: lm_head is quantized too
}

// Meta returns the metadata Unpack needs from the config: the scheme under SchemeKey.
func (c Config) Meta() map[string]string {
	return map[string]string{SchemeKey: c.Scheme.String()}
}

// ctVersion is the compressed-tensors version written into its config (docs/reference/formats.md
// §3.4); ctVersionMXFP4 the first whose mxfp4-pack-quantized scales are standard E8M0
// (docs/fp4.md).
const (
	ctVersion      = "0.12.2"
	ctVersionMXFP4 = "0.14.0"
)

// groupSizeJSON maps PerChannel to the −1 every format's config uses for it.
func groupSizeJSON(s quant.Scheme) int {
	if s.GroupSize == quant.PerChannel {
		return -1
	}
	return s.GroupSize
}

// QuantizationConfig returns the "quantization_config" object for config.json (for GPTQ the
// same object is also quantize_config.json), per docs/reference/formats.md §1.7, §2.3 and §3.4.
func QuantizationConfig(c Config) (map[string]any, error) {
	f, err := Lookup(c.Format)
	if err != nil {
		return nil, err
	}
	if err := f.Supports(c.Scheme); err != nil {
		return nil, err
	}
	s := c.Scheme
	switch f.(type) {
	case GPTQ:
		m := map[string]any{
			"quant_method": "gptq", "bits": s.Bits, "group_size": groupSizeJSON(s),
			"desc_act": c.DescAct, "sym": s.Sym, "damp_percent": 0.01, "true_sequential": true,
			"static_groups": false, "checkpoint_format": f.Name(), "lm_head": c.LMHead,
			"pack_dtype": "int32", "model_name_or_path": nil, "model_file_base_name": "model",
		}
		if dyn := gptqDynamic(c.Ignore); len(dyn) > 0 {
			m["dynamic"] = dyn
		}
		return m, nil
	case AWQ:
		if c.DescAct {
			return nil, fmt.Errorf("format awq has no act-order (desc_act): use format gptq")
		}
		var ignore any
		if len(c.Ignore) > 0 {
			ignore = c.Ignore
		}
		return map[string]any{"quant_method": "awq", "zero_point": true, "group_size": groupSizeJSON(s),
			"bits": 4, "version": "gemm", "modules_to_not_convert": ignore}, nil
	case CompressedTensors:
		return compressedTensorsConfig(c), nil
	case FP8Block:
		return fp8BlockConfig(c), nil
	default:
		return map[string]any{"quant_method": "qpack", "version": 1, "scheme": s.String(),
			"desc_act": c.DescAct, "ignore": nonNil(c.Ignore)}, nil
	}
}

// gptqDynamic excludes ignored modules other than lm_head (which has its own key) through
// GPTQModel's per-module overrides, which vLLM also reads: "-:regex" skips matching modules.
func gptqDynamic(ignore []string) map[string]any {
	dyn := map[string]any{}
	for _, name := range ignore {
		if name != "lm_head" {
			dyn["-:^"+regexp.QuoteMeta(name)+"$"] = map[string]any{}
		}
	}
	return dyn
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func compressedTensorsConfig(c Config) map[string]any {
	s := c.Scheme
	weights := map[string]any{
		"num_bits": s.Bits, "type": "int", "symmetric": s.Sym, "strategy": "group",
		"group_size": s.GroupSize, "block_structure": nil, "dynamic": false, "actorder": nil,
		"observer": "minmax", "observer_kwargs": map[string]any{},
	}
	format, version := "pack-quantized", ctVersion
	switch {
	case s.GroupSize == quant.PerChannel:
		weights["strategy"], weights["group_size"] = "channel", nil
	case s.Grid == quant.NVFP4: // the NVFP4A16 preset: one global scale per tensor
		weights["type"], weights["strategy"] = "float", "tensor_group"
		format = "nvfp4-pack-quantized"
	case s.Grid == quant.MXFP4: // the MXFP4A16 preset; standard E8M0 scales from 0.14.0 on
		weights["type"] = "float"
		format, version = "mxfp4-pack-quantized", ctVersionMXFP4
	}
	if c.DescAct {
		weights["actorder"] = "group"
	}
	return map[string]any{
		"quant_method": "compressed-tensors", "format": format,
		"quantization_status": "compressed", "global_compression_ratio": nil,
		"ignore": nonNil(c.Ignore), "kv_cache_scheme": nil,
		"sparsity_config": map[string]any{}, "transform_config": map[string]any{},
		"version": version,
		"config_groups": map[string]any{"group_0": map[string]any{
			"targets": []string{"Linear"}, "format": format,
			"input_activations": nil, "output_activations": nil, "weights": weights,
		}},
	}
}

// ParseConfig reads a quantization config back: data is config.json (with a
// "quantization_config" object), quantize_config.json, or the bare object.
func ParseConfig(data []byte) (Config, error) {
	var top map[string]any
	if err := json.Unmarshal(data, &top); err != nil {
		return Config{}, fmt.Errorf("quantization config: %w", err)
	}
	q := top
	if inner, ok := top["quantization_config"]; ok {
		if q, ok = inner.(map[string]any); !ok {
			return Config{}, fmt.Errorf("quantization config: quantization_config is not an object")
		}
	}
	method, _ := q["quant_method"].(string)
	if method == "" && q["bits"] != nil { // AutoGPTQ's quantize_config.json before quant_method
		method = "gptq"
	}
	var c Config
	var err error
	switch strings.ToLower(method) {
	case "gptq":
		c, err = parseGPTQ(q)
	case "awq":
		c, err = parseAWQ(q)
	case "compressed-tensors":
		c, err = parseCompressedTensors(q)
	case "qpack":
		c, err = parseQPack(q)
	case "fp8":
		c, err = parseFP8Block(q)
	case "":
		return Config{}, fmt.Errorf("quantization config: no quant_method (the checkpoint is not quantized?)")
	default:
		return Config{}, fmt.Errorf("quantization config: quant_method %q is not supported (want gptq, awq, compressed-tensors, fp8 or qpack)", method)
	}
	if err != nil {
		return Config{}, fmt.Errorf("quantization config (%s): %w", method, err)
	}
	if err := c.Scheme.Validate(); err != nil {
		return Config{}, fmt.Errorf("quantization config (%s): %w", method, err)
	}
	return c, nil
}

// jsonInt reads the first present key of keys as an integer.
func jsonInt(m map[string]any, keys ...string) (int, bool, error) {
	for _, k := range keys {
		v, ok := m[k]
		if !ok || v == nil {
			continue
		}
		f, ok := v.(float64)
		if !ok || f != float64(int(f)) {
			return 0, false, fmt.Errorf("%s = %v is not an integer", k, v)
		}
		return int(f), true, nil
	}
	return 0, false, nil
}

func jsonBool(m map[string]any, key string, def bool) (bool, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return def, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, fmt.Errorf("%s = %v is not a boolean", key, v)
	}
	return b, nil
}

func jsonStrings(m map[string]any, key string) ([]string, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s is not a list", key)
	}
	out := make([]string, len(list))
	for i, e := range list {
		if out[i], ok = e.(string); !ok {
			return nil, fmt.Errorf("%s[%d] = %v is not a string", key, i, e)
		}
	}
	return out, nil
}

// bitsAndGroup reads the integer scheme's bits and group size (−1 = per channel).
func bitsAndGroup(m map[string]any, bitsKeys, groupKeys []string) (quant.Scheme, error) {
	bits, ok, err := jsonInt(m, bitsKeys...)
	if err != nil {
		return quant.Scheme{}, err
	}
	if !ok {
		return quant.Scheme{}, fmt.Errorf("%s is missing", bitsKeys[0])
	}
	g, ok, err := jsonInt(m, groupKeys...)
	if err != nil {
		return quant.Scheme{}, err
	}
	if !ok {
		return quant.Scheme{}, fmt.Errorf("%s is missing", groupKeys[0])
	}
	if g == -1 {
		g = quant.PerChannel
	} else if g <= 0 {
		return quant.Scheme{}, fmt.Errorf("group size %d (want −1 or positive)", g)
	}
	return quant.Scheme{Grid: quant.Integer, Bits: bits, GroupSize: g}, nil
}

func parseGPTQ(q map[string]any) (Config, error) {
	s, err := bitsAndGroup(q, []string{"bits", "w_bit"}, []string{"group_size", "q_group_size"})
	if err != nil {
		return Config{}, err
	}
	if !gptqWidth(s.Bits) {
		return Config{}, fmt.Errorf("bits %d: GPTQ checkpoints hold 2, 3, 4 or 8 bits", s.Bits)
	}
	if marlin, _ := jsonBool(q, "is_marlin_format", false); marlin {
		return Config{}, fmt.Errorf("the old Marlin-packed GPTQ format is not supported")
	}
	c := Config{Format: "gptq"}
	if s.Sym, err = jsonBool(q, "sym", true); err != nil {
		return Config{}, err
	}
	if c.DescAct, err = jsonBool(q, "desc_act", false); err != nil {
		return Config{}, err
	}
	if c.LMHead, err = jsonBool(q, "lm_head", false); err != nil {
		return Config{}, err
	}
	c.Scheme = s
	format, _ := q["checkpoint_format"].(string)
	if format == "" {
		format, _ = q["format"].(string)
	}
	switch format {
	case "", "gptq":
	case "gptq_v2":
		c.Format = "gptq_v2"
	default:
		return Config{}, fmt.Errorf("checkpoint_format %q is not supported (want gptq or gptq_v2)", format)
	}
	return c, nil
}

func parseAWQ(q map[string]any) (Config, error) {
	s, err := bitsAndGroup(q, []string{"bits", "w_bit"}, []string{"group_size", "q_group_size"})
	if err != nil {
		return Config{}, err
	}
	if _, ok := q["zero_point"]; !ok {
		return Config{}, fmt.Errorf("zero_point is missing")
	}
	zp, err := jsonBool(q, "zero_point", true)
	if err != nil {
		return Config{}, err
	}
	s.Sym = !zp
	if v, _ := q["version"].(string); v != "" && !strings.EqualFold(v, "gemm") {
		return Config{}, fmt.Errorf("version %q is not supported (only the GEMM layout)", v)
	}
	ignore, err := jsonStrings(q, "modules_to_not_convert")
	return Config{Format: "awq", Scheme: s, Ignore: ignore}, err
}

func parseCompressedTensors(q map[string]any) (Config, error) {
	groups, _ := q["config_groups"].(map[string]any)
	if len(groups) == 0 {
		return Config{}, fmt.Errorf("config_groups is missing or empty")
	}
	var c Config
	first := true
	for name, g := range groups {
		gm, _ := g.(map[string]any)
		w, _ := gm["weights"].(map[string]any)
		if w == nil {
			return Config{}, fmt.Errorf("config_groups.%s has no weights", name)
		}
		format, _ := gm["format"].(string)
		if format == "" {
			format, _ = q["format"].(string)
		}
		gc, err := parseCTWeights(w)
		if err != nil {
			return Config{}, fmt.Errorf("config_groups.%s.weights: %w", name, err)
		}
		if want := ctFormat(gc.Scheme); format != want {
			return Config{}, fmt.Errorf("config_groups.%s: format %q is not supported for %s weights (want %s)", name, format, gc.Scheme, want)
		}
		if !first && (gc.Scheme != c.Scheme || gc.DescAct != c.DescAct) {
			return Config{}, fmt.Errorf("config groups with different weight schemes (%s, %s) are not supported", c.Scheme, gc.Scheme)
		}
		c, first = gc, false
	}
	ignore, err := jsonStrings(q, "ignore")
	c.Ignore = ignore
	return c, err
}

// ctFormat is the compressed-tensors format that holds scheme s.
func ctFormat(s quant.Scheme) string {
	switch s.Grid {
	case quant.NVFP4:
		return "nvfp4-pack-quantized"
	case quant.MXFP4:
		return "mxfp4-pack-quantized"
	}
	return "pack-quantized"
}

func parseCTWeights(w map[string]any) (Config, error) {
	t, _ := w["type"].(string)
	if t == "float" {
		return parseCTFloat(w)
	}
	if t != "int" {
		return Config{}, fmt.Errorf("type %q is not supported (want int or float)", t)
	}
	bits, ok, err := jsonInt(w, "num_bits")
	if err != nil || !ok {
		return Config{}, fmt.Errorf("num_bits is missing or bad (%v)", err)
	}
	sym, err := jsonBool(w, "symmetric", true)
	if err != nil {
		return Config{}, err
	}
	s := quant.Scheme{Grid: quant.Integer, Bits: bits, Sym: sym}
	strategy, _ := w["strategy"].(string)
	g, hasGroup, err := jsonInt(w, "group_size")
	if err != nil {
		return Config{}, err
	}
	switch {
	case strategy == "group" || (strategy == "" && hasGroup && g > 0):
		if !hasGroup || g <= 0 {
			return Config{}, fmt.Errorf("group strategy needs a positive group_size")
		}
		s.GroupSize = g
	case strategy == "channel" || (strategy == "" && hasGroup && g == -1):
		s.GroupSize = quant.PerChannel
	default:
		return Config{}, fmt.Errorf("strategy %q is not supported (want group or channel)", strategy)
	}
	c := Config{Format: "compressed-tensors", Scheme: s}
	if a, ok := w["actorder"]; ok && a != nil && a != false {
		c.DescAct = true
	}
	return c, nil
}

// parseCTFloat reads the float weight schemes compressed-tensors packs: NVFP4 (4 bits,
// strategy tensor_group, groups of 16) and MXFP4 (4 bits, strategy group, groups of 32), both
// symmetric.
func parseCTFloat(w map[string]any) (Config, error) {
	bits, _, err := jsonInt(w, "num_bits")
	if err != nil {
		return Config{}, err
	}
	g, _, err := jsonInt(w, "group_size")
	if err != nil {
		return Config{}, err
	}
	sym, err := jsonBool(w, "symmetric", true)
	if err != nil {
		return Config{}, err
	}
	strategy, _ := w["strategy"].(string)
	switch {
	case bits == 4 && sym && g == 16 && strategy == "tensor_group":
		return Config{Format: "compressed-tensors", Scheme: quant.NVFP4Scheme}, nil
	case bits == 4 && sym && g == 32 && strategy == "group":
		return Config{Format: "compressed-tensors", Scheme: quant.MXFP4Scheme}, nil
	}
	return Config{}, fmt.Errorf("type float with %d bits, strategy %q, group size %d, symmetric %v are not supported (want NVFP4: 4 bits, tensor_group, 16; or MXFP4: 4 bits, group, 32; symmetric)",
		bits, strategy, g, sym)
}

// fp8BlockConfig is the config of the FP8 releases (DeepSeek-V3, Qwen3-FP8), which transformers'
// FineGrainedFP8Config and vLLM's Fp8Config read; the ignored modules go to both loaders' keys
// (modules_to_not_convert, ignored_layers).
func fp8BlockConfig(c Config) map[string]any {
	m := map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
		"weight_block_size": []int{c.Scheme.GroupSize, c.Scheme.GroupSize}}
	if len(c.Ignore) > 0 {
		m["modules_to_not_convert"], m["ignored_layers"] = c.Ignore, c.Ignore
	}
	return m
}

// parseFP8Block reads a block FP8 config: weight_block_size [B, B] (square blocks only).
func parseFP8Block(q map[string]any) (Config, error) {
	list, _ := q["weight_block_size"].([]any)
	if list == nil {
		return Config{}, fmt.Errorf("no weight_block_size: per-tensor FP8 checkpoints are not supported, only block-scaled ones")
	}
	if len(list) != 2 || list[0] != list[1] {
		return Config{}, fmt.Errorf("weight_block_size %v: only square blocks [B, B] are supported", list)
	}
	b, ok := list[0].(float64)
	if !ok || b != float64(int(b)) || b <= 0 {
		return Config{}, fmt.Errorf("weight_block_size %v is not a pair of positive integers", list)
	}
	if f, _ := q["fmt"].(string); f != "" && f != "e4m3" {
		return Config{}, fmt.Errorf("fmt %q is not supported (want e4m3)", f)
	}
	c := Config{Format: "fp8", Scheme: quant.FP8BlockScheme(int(b))}
	ignore, err := jsonStrings(q, "modules_to_not_convert")
	if err == nil && ignore == nil {
		ignore, err = jsonStrings(q, "ignored_layers")
	}
	c.Ignore = ignore
	return c, err
}

func parseQPack(q map[string]any) (Config, error) {
	name, _ := q["scheme"].(string)
	s, err := quant.ParseScheme(name)
	if err != nil {
		return Config{}, err
	}
	c := Config{Format: "qpack", Scheme: s}
	if c.DescAct, err = jsonBool(q, "desc_act", false); err != nil {
		return Config{}, err
	}
	c.Ignore, err = jsonStrings(q, "ignore")
	return c, err
}
