package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// checkDestination refuses to start when dst exists, unless overwriting was asked for.
func checkDestination(dst string, overwrite bool) error {
	if _, err := os.Stat(dst); err == nil && !overwrite {
		return fmt.Errorf("output %s already exists (use --overwrite to replace it)", dst)
	}
	return nil
}

// writeStaged builds the output in a temporary sibling directory and renames it to dst only
// when write succeeded, so a failed or killed run never leaves a directory that looks complete.
func writeStaged(dst string, overwrite bool, write func(dir string) error) (err error) {
	parent := filepath.Dir(filepath.Clean(dst))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dst)+".tmp-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if err = os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err = write(tmp); err != nil {
		return err
	}
	if overwrite {
		if err = os.RemoveAll(dst); err != nil {
			return err
		}
	}
	return os.Rename(tmp, dst)
}

// readModelConfig reads config.json as a generic object; the layouts that runtimes load need it.
func readModelConfig(dir string, f packing.Format) (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if errors.Is(err, os.ErrNotExist) {
		if f.Name() == "qpack" {
			return nil, nil
		}
		return nil, fmt.Errorf("%s has no config.json, which the %s format needs to record its quantization config (the qpack format does not)", dir, f.Name())
	}
	if err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", filepath.Join(dir, "config.json"), err)
	}
	if _, done := cfg["quantization_config"]; done {
		return nil, fmt.Errorf("%s is already quantized (config.json has a quantization_config)", dir)
	}
	return cfg, nil
}

// quantConfig describes the output for the format's quantization_config.
func quantConfig(f packing.Format, items []Item) packing.Config {
	main, _, _ := mainScheme(items)
	c := packing.Config{Format: f.Name(), Scheme: main}
	for _, it := range items {
		isWeight := strings.HasSuffix(it.Info.Name, ".weight") && len(it.Info.Shape) == 2
		if it.Scheme == nil && isWeight && (it.Role.IsLinear() || it.Role == model.RoleClassifier) {
			c.Ignore = append(c.Ignore, it.Module)
		}
		if it.Scheme != nil && it.Role == model.RoleClassifier {
			c.LMHead = true
		}
	}
	return c
}

// writeModelConfigs writes config.json with its quantization_config (and, for GPTQ, the same
// object as quantize_config.json).
func writeModelConfigs(dir string, cfg map[string]any, f packing.Format, items []Item) error {
	if _, _, any := mainScheme(items); cfg == nil || !any {
		return nil
	}
	qc, err := packing.QuantizationConfig(quantConfig(f, items))
	if err != nil {
		return err
	}
	cfg["quantization_config"] = qc
	if err := writeJSON(filepath.Join(dir, "config.json"), cfg); err != nil {
		return err
	}
	if _, ok := f.(packing.GPTQ); ok {
		return writeJSON(filepath.Join(dir, "quantize_config.json"), qc)
	}
	return nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// copyAuxFiles copies the tokenizer, generation config and other small files; weights in other
// containers (.bin, .pt, .gguf) are skipped with a note, since the output replaces them.
func copyAuxFiles(src, dst string, log io.Writer) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(name, ".") || name == "config.json" ||
			name == "quantize_config.json" || name == safetensors.IndexName || strings.HasSuffix(name, ".safetensors") {
			continue
		}
		switch filepath.Ext(name) {
		case ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack":
			fmt.Fprintf(log, "not copying %s (weights in another container)\n", name)
			continue
		}
		if err := copyFile(filepath.Join(src, name), filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Provenance is what every output records about how it was made.
type Provenance struct {
	Tool    string      `json:"tool"`
	Version string      `json:"version"`
	Method  string      `json:"method"`
	Format  string      `json:"format"`
	Inputs  []InputFile `json:"inputs"`
	Plan    *alloc.Plan `json:"plan"`
	// Calibration identifies the calibration data, when there was any.
	Calibration *Calibration   `json:"calibration,omitempty"`
	Options     map[string]any `json:"options"`
}

// InputFile identifies one input file by name, size and SHA-256.
type InputFile struct {
	Name   string `json:"name"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// ProvenanceKey is the __metadata__ key holding the Provenance JSON.
const ProvenanceKey = "qpack.provenance"

// outputMetadata builds each output file's __metadata__: the format's per-tensor entries, its
// config entries, and the provenance.
func outputMetadata(ck *safetensors.Checkpoint, items []Item, plan *alloc.Plan, calib *Calibration, f packing.Format, opt Options) (map[string]string, error) {
	meta := map[string]string{}
	if _, _, any := mainScheme(items); any {
		meta = quantConfig(f, items).Meta()
	}
	prov := Provenance{Tool: "qpack", Version: opt.Version, Method: opt.Method, Format: f.Name(), Plan: plan,
		Calibration: calib, Options: map[string]any{"clip": opt.Clip}}
	for _, it := range items {
		if it.Scheme == nil {
			continue
		}
		for k, v := range f.Metadata(it.Module, &quant.Tensor{Scheme: *it.Scheme}) {
			meta[k] = v
		}
	}
	inputs, err := hashInputs(ck.Files())
	if err != nil {
		return nil, err
	}
	prov.Inputs = inputs
	b, err := json.Marshal(prov)
	if err != nil {
		return nil, err
	}
	meta[ProvenanceKey] = string(b)
	return meta, nil
}

// hashInputs computes the SHA-256 of every input file, a few files at a time.
func hashInputs(paths []string) ([]InputFile, error) {
	out := make([]InputFile, len(paths))
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i, p := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = hashFile(p)
		}()
	}
	wg.Wait()
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out, errors.Join(errs...)
}

func hashFile(path string) (InputFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return InputFile{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return InputFile{}, fmt.Errorf("%s: %w", path, err)
	}
	return InputFile{Name: filepath.Base(path), Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}
