package packing

import (
	"fmt"
	"sort"
	"strings"

	"github.com/qpack-dev/qpack/quant"
)

// Format is one on-disk layout of quantized linear weights.
type Format interface {
	// Name is the registry name: "gptq", "gptq_v2", "awq", "compressed-tensors", "qpack" or
	// "fp8" (block-scaled FP8).
	Name() string
	// Supports returns nil when the layout can hold tensors of scheme s, else an error that
	// says why and names a format that can.
	Supports(s quant.Scheme) error
	// MixedSchemes says whether one checkpoint can hold tensors of several schemes (a
	// per-tensor plan); the other layouts' quantization config describes a single scheme.
	MixedSchemes() bool
	// Pack encodes t as the stored tensors of the module prefix (e.g. "model.layers.0.mlp.up_proj").
	Pack(prefix string, t *quant.Tensor) ([]Raw, error)
	// Metadata returns the safetensors __metadata__ entries that Unpack needs besides the
	// tensors and the checkpoint's quantization config (only qpack records per-tensor entries).
	Metadata(prefix string, t *quant.Tensor) map[string]string
	// Unpack decodes the tensors of prefix. meta is the checkpoint's __metadata__ merged with
	// Config.Meta() of its quantization config; see SchemeKey.
	Unpack(prefix string, get func(name string) (Raw, bool), meta map[string]string) (*quant.Tensor, error)
	// Bytes is the exact number of bytes Pack stores for an N×K weight of scheme s, scales,
	// zero points, shapes and GPTQ's g_idx included. The g_idx that compressed-tensors and qpack
	// write only for act-order tensors is not included: it adds 4·K bytes.
	Bytes(s quant.Scheme, n, k int) int64
	// TensorNames lists every tensor name Pack may write for prefix, optional ones included;
	// the first is the one every packed module has.
	TensorNames(prefix string) []string
	// Dims returns the [N, K] of the packed module prefix from tensor shapes (and, where the
	// layout stores the shape as data, that 16-byte tensor) without decoding any weights.
	Dims(prefix string, get func(name string) (Raw, bool)) (n, k int, err error)
}

// SchemeKey is the metadata key holding the scheme of every quantized tensor of a checkpoint
// (written by Config.Meta); SchemeKey+"."+prefix overrides it for one tensor (what qpack writes).
const SchemeKey = "qpack.scheme"

// SchemeOf finds the scheme of module prefix in a checkpoint's metadata merged with its
// Config.Meta(): the per-tensor key first, then the checkpoint-wide one.
func SchemeOf(prefix string, meta map[string]string) (quant.Scheme, error) {
	return schemeFor(prefix, meta)
}

// refuseKQuant refuses a k-quant or IQ scheme in a layout other than qpack, naming qpack.
func refuseKQuant(format string, s quant.Scheme) error {
	switch s.Grid {
	case quant.KQuant:
		return fmt.Errorf("format %s cannot hold %s, a llama.cpp k-quant with super-blocks: use format qpack (qpack export gguf then writes it for llama.cpp)", format, s)
	case quant.IQuant:
		return fmt.Errorf("format %s cannot hold %s, a llama.cpp IQ type: use format qpack (qpack export gguf then writes it for llama.cpp)", format, s)
	}
	return nil
}

// supportedScheme finds the scheme of prefix in meta and checks that f can hold it.
func supportedScheme(f Format, prefix string, meta map[string]string) (quant.Scheme, error) {
	s, err := schemeFor(prefix, meta)
	if err != nil {
		return s, err
	}
	if err := f.Supports(s); err != nil {
		return s, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	return s, nil
}

// schemeFor finds the scheme of prefix in meta.
func schemeFor(prefix string, meta map[string]string) (quant.Scheme, error) {
	name, ok := meta[SchemeKey+"."+prefix]
	if !ok {
		name, ok = meta[SchemeKey]
	}
	if !ok {
		return quant.Scheme{}, fmt.Errorf("tensor %s: no scheme in metadata (keys %s.%s or %s)", prefix, SchemeKey, prefix, SchemeKey)
	}
	s, err := quant.ParseScheme(name)
	if err != nil {
		return quant.Scheme{}, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	return s, nil
}

var registry = map[string]Format{}

func register(f Format) { registry[f.Name()] = f }

func init() {
	register(GPTQ{})
	register(GPTQ{V2: true})
	register(AWQ{})
	register(CompressedTensors{})
	register(QPack{})
	register(FP8Block{})
}

// Lookup returns the format registered under name.
func Lookup(name string) (Format, error) {
	if f, ok := registry[name]; ok {
		return f, nil
	}
	return nil, fmt.Errorf("unknown format %q (known: %s)", name, strings.Join(Names(), ", "))
}

// Names lists the registered format names, sorted.
func Names() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// packedTensorSuffix is the name ending that marks a packed weight of each format, checked
// in this order (GPTQ and AWQ share ".qweight"; GPTQ always has a g_idx beside it).
var packedTensorSuffix = []struct{ suffix, format string }{
	{".qpack_codes", "qpack"},
	{".weight_scale_inv", "fp8"},
	{".weight_packed", "compressed-tensors"},
	{".g_idx", "gptq"},
	{".qweight", "awq"},
}

// Detect tells which format a checkpoint uses. configJSON is the content of config.json or
// quantize_config.json (nil when there is none); its quantization config decides when present,
// else the tensor names do. The tensor names must not contradict the config.
func Detect(names []string, configJSON []byte) (Format, error) {
	fromNames := ""
	for _, p := range packedTensorSuffix {
		for _, n := range names {
			if strings.HasSuffix(n, p.suffix) {
				fromNames = p.format
				break
			}
		}
		if fromNames != "" {
			break
		}
	}
	if configJSON != nil {
		cfg, err := ParseConfig(configJSON)
		if err != nil {
			return nil, err
		}
		base := strings.TrimSuffix(cfg.Format, "_v2")
		if fromNames != "" && fromNames != base && !(base == "gptq" && fromNames == "awq") {
			return nil, fmt.Errorf("config says %s but the tensor names look like %s", cfg.Format, fromNames)
		}
		return Lookup(cfg.Format)
	}
	if fromNames == "" {
		return nil, fmt.Errorf("no packed tensors found (no name ends in .qweight, .weight_packed, .weight_scale_inv or .qpack_codes)")
	}
	return Lookup(fromNames)
}
