// Package quantized reads checkpoints in any layout qpack writes (GPTQ, AWQ,
// compressed-tensors, qpack, block-scaled FP8): it finds the quantized modules, unpacks them to
// quant.Tensors, and presents the checkpoint as plain weights, dequantizing a module when it is
// asked for.
package quantized

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// Checkpoint is a safetensors checkpoint whose quantized modules read as ordinary weights.
// A checkpoint with no quantization config and no packed tensors is read as it is.
type Checkpoint struct {
	*safetensors.Checkpoint
	Format packing.Format // nil when nothing is quantized
	meta   map[string]string
	owner  map[string]string // stored tensor name → module prefix
	mods   []string          // module prefixes, sorted
}

// Open opens the checkpoint at path and detects its layout from config.json (or
// quantize_config.json) and the tensor names.
func Open(path string) (*Checkpoint, error) {
	ck, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Checkpoint: ck, owner: map[string]string{}}
	if err := c.detect(); err != nil {
		ck.Close()
		return nil, err
	}
	return c, nil
}

func (c *Checkpoint) detect() error {
	cfgJSON, err := readQuantConfig(c.Dir)
	if err != nil {
		return err
	}
	f, err := packing.Detect(c.Checkpoint.Names(), cfgJSON)
	if err != nil {
		if cfgJSON == nil {
			return nil // not quantized: plain weights
		}
		return fmt.Errorf("%s: %w", c.Dir, err)
	}
	c.Format = f
	c.meta = map[string]string{}
	for k, v := range c.Checkpoint.Metadata() {
		c.meta[k] = v
	}
	if cfgJSON != nil {
		cfg, err := packing.ParseConfig(cfgJSON)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Dir, err)
		}
		for k, v := range cfg.Meta() {
			if _, ok := c.meta[k]; !ok {
				c.meta[k] = v
			}
		}
	}
	c.findModules()
	return c.checkFP8Scales()
}

// checkFP8Scales refuses a block FP8 checkpoint with an F8_E4M3 weight that has no
// weight_scale_inv beside it: read on its own, it would decode to weights off by the missing
// scale.
func (c *Checkpoint) checkFP8Scales() error {
	if _, ok := c.Format.(packing.FP8Block); !ok {
		return nil
	}
	for _, name := range c.Checkpoint.Names() {
		info, _ := c.Checkpoint.Info(name)
		if prefix, ok := strings.CutSuffix(name, ".weight"); ok && info.DType == safetensors.F8E4M3 && !c.IsModule(prefix) {
			return fmt.Errorf("%s: tensor %s is FP8 (E4M3) but %s.weight_scale_inv, its block scales, is missing", c.Dir, name, prefix)
		}
	}
	return nil
}

// readQuantConfig returns config.json when it has a quantization_config, else
// quantize_config.json, else nil.
func readQuantConfig(dir string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err == nil && strings.Contains(string(b), `"quantization_config"`) {
		return b, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	b, err = os.ReadFile(filepath.Join(dir, "quantize_config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// findModules takes every name ending in the layout's primary packed tensor (the first of
// TensorNames) as a module, and records which stored tensors belong to it.
func (c *Checkpoint) findModules() {
	primary := c.Format.TensorNames("")[0]
	for _, name := range c.Checkpoint.Names() {
		if strings.HasSuffix(name, primary) {
			prefix := strings.TrimSuffix(name, primary)
			c.mods = append(c.mods, prefix)
			for _, owned := range c.Format.TensorNames(prefix) {
				if _, ok := c.Checkpoint.Info(owned); ok {
					c.owner[owned] = prefix
				}
			}
		}
	}
	sort.Strings(c.mods)
}

// Modules lists the quantized modules' prefixes, e.g. "model.layers.0.mlp.up_proj".
func (c *Checkpoint) Modules() []string { return c.mods }

// IsModule reports whether prefix is a quantized module.
func (c *Checkpoint) IsModule(prefix string) bool {
	i := sort.SearchStrings(c.mods, prefix)
	return i < len(c.mods) && c.mods[i] == prefix
}

// Owner returns the module a stored tensor belongs to, if any.
func (c *Checkpoint) Owner(stored string) (string, bool) {
	p, ok := c.owner[stored]
	return p, ok
}

// raw gives the layouts a stored tensor as a zero-copy view; its bytes are only read if used.
func (c *Checkpoint) raw(name string) (packing.Raw, bool) {
	info, b, ok := c.Checkpoint.Stored(name)
	if !ok {
		return packing.Raw{}, false
	}
	return packing.Raw{Name: name, DType: string(info.DType), Shape: info.Shape, Data: b}, true
}

// ModuleInfo describes a quantized module without decoding it.
type ModuleInfo struct {
	Prefix string
	Scheme quant.Scheme
	N, K   int
	Stored []string // its stored tensors
	Bytes  int64    // their total size
}

// BPW is the module's stored bits per weight, scales, zeros and g_idx included.
func (m ModuleInfo) BPW() float64 { return float64(8*m.Bytes) / float64(m.N*m.K) }

// Module describes the quantized module prefix from headers (and the small shape tensors).
func (c *Checkpoint) Module(prefix string) (ModuleInfo, error) {
	if !c.IsModule(prefix) {
		return ModuleInfo{}, fmt.Errorf("%s is not a quantized module of %s", prefix, c.Dir)
	}
	s, err := packing.SchemeOf(prefix, c.meta)
	if err != nil {
		return ModuleInfo{}, fmt.Errorf("%s: %w", c.Dir, err)
	}
	n, k, err := c.Format.Dims(prefix, c.raw)
	if err != nil {
		return ModuleInfo{}, fmt.Errorf("%s: %w", c.Dir, err)
	}
	m := ModuleInfo{Prefix: prefix, Scheme: s, N: n, K: k}
	for _, name := range c.Format.TensorNames(prefix) {
		if info, _, ok := c.Checkpoint.Stored(name); ok {
			m.Stored = append(m.Stored, name)
			m.Bytes += info.Size
		}
	}
	return m, nil
}

// Unpack decodes the quantized module prefix.
func (c *Checkpoint) Unpack(prefix string) (*quant.Tensor, error) {
	if !c.IsModule(prefix) {
		return nil, fmt.Errorf("%s is not a quantized module of %s", prefix, c.Dir)
	}
	t, err := c.Format.Unpack(prefix, c.raw, c.meta)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Dir, err)
	}
	return t, nil
}

// Names lists the logical tensors: unquantized tensors as stored, and one "<module>.weight"
// per quantized module, sorted.
func (c *Checkpoint) Names() []string {
	var out []string
	for _, n := range c.Checkpoint.Names() {
		if _, owned := c.owner[n]; !owned {
			out = append(out, n)
		}
	}
	for _, m := range c.mods {
		out = append(out, m+".weight")
	}
	sort.Strings(out)
	return out
}

// moduleOf returns the module whose dequantized weight the logical name stands for: a
// "<module>.weight" that is not stored, or is stored as one of the module's own tensors (block
// FP8 keeps its codes under that name).
func (c *Checkpoint) moduleOf(name string) (string, bool) {
	prefix, ok := strings.CutSuffix(name, ".weight")
	if ok && c.IsModule(prefix) {
		if _, stored := c.Checkpoint.Info(name); !stored || c.owner[name] == prefix {
			return prefix, true
		}
	}
	return "", false
}

// Float32 returns a logical tensor as float32, dequantizing a quantized module's weight.
func (c *Checkpoint) Float32(name string) ([]float32, error) {
	if prefix, ok := c.moduleOf(name); ok {
		t, err := c.Unpack(prefix)
		if err != nil {
			return nil, err
		}
		return t.Dequantize(nil), nil
	}
	return c.Checkpoint.Float32(name)
}

// Float32Into is Float32 into dst, which must hold exactly the tensor's values (the embedded
// safetensors.Checkpoint's would read a quantized module's packed tensors as its weight).
func (c *Checkpoint) Float32Into(name string, dst []float32) ([]float32, error) {
	prefix, ok := c.moduleOf(name)
	if !ok {
		return c.Checkpoint.Float32Into(name, dst)
	}
	t, err := c.Unpack(prefix)
	if err != nil {
		return nil, err
	}
	if len(dst) != t.N*t.K {
		return nil, fmt.Errorf("tensor %q: destination holds %d values, tensor has %d", name, len(dst), t.N*t.K)
	}
	return t.Dequantize(dst), nil
}

// Shape returns a logical tensor's shape; a quantized module's is its [N, K].
func (c *Checkpoint) Shape(name string) ([]int, bool) {
	prefix, ok := c.moduleOf(name)
	if !ok {
		return c.Checkpoint.Shape(name)
	}
	n, k, err := c.Format.Dims(prefix, c.raw)
	if err != nil {
		return nil, false
	}
	return []int{n, k}, true
}
