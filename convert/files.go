package convert

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
func outputMetadata(items []Item, plan *alloc.Plan, calib *Calibration, inputs []InputFile, f packing.Format, opt Options) (map[string]string, error) {
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
	prov.Inputs = inputs
	b, err := json.Marshal(prov)
	if err != nil {
		return nil, err
	}
	meta[ProvenanceKey] = string(b)
	return meta, nil
}

// inputHashes computes the inputs' SHA-256 while the conversion runs, so that reading the
// inputs twice costs no extra wall time. The header, written first, carries a placeholder of a
// hash's length for each input; patch puts the hashes in the finished files before the output
// directory is renamed into place.
type inputHashes struct {
	inputs       []InputFile // SHA256 holds the placeholder until patch
	placeholders []string
	hashes       []string
	err          error
	done         chan struct{}
	stop         atomic.Bool
	seconds      float64 // hashing, start to end
	waited       float64 // patch waiting for the hashes: the hashing's share of the critical path
}

// startHashing starts hashing every input file, several at a time. SHA-256 of one file is
// sequential, so the largest file bounds the hashing time: the largest start first.
func startHashing(paths []string) (*inputHashes, error) {
	h := &inputHashes{hashes: make([]string, len(paths)), done: make(chan struct{})}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	for i, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		ph := fmt.Sprintf("pending-sha256-%x-%d-", nonce, i)
		ph += strings.Repeat(".", sha256.Size*2-len(ph))
		h.placeholders = append(h.placeholders, ph)
		h.inputs = append(h.inputs, InputFile{Name: filepath.Base(p), Bytes: st.Size(), SHA256: ph})
	}
	go h.run(paths)
	return h, nil
}

func (h *inputHashes) run(paths []string) {
	defer close(h.done)
	start := time.Now()
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(4, runtime.NumCPU()/2))
	for _, i := range h.largestFirst() {
		p := paths[i]
		wg.Add(1)
		sem <- struct{}{} // taken in order, so that the largest files start first
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			h.hashes[i], errs[i] = h.hashFile(p)
		}()
	}
	wg.Wait()
	h.err = errors.Join(errs...)
	h.seconds = time.Since(start).Seconds()
}

// largestFirst lists the inputs' indices by decreasing size.
func (h *inputHashes) largestFirst() []int {
	order := make([]int, len(h.inputs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return h.inputs[order[a]].Bytes > h.inputs[order[b]].Bytes })
	return order
}

// bytes is the size of all the inputs.
func (h *inputHashes) bytes() int64 {
	var n int64
	for _, in := range h.inputs {
		n += in.Bytes
	}
	return n
}

func (h *inputHashes) hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sum := sha256.New()
	buf := make([]byte, 4<<20)
	for !h.stop.Load() {
		n, err := f.Read(buf)
		sum.Write(buf[:n])
		if err == io.EOF {
			return hex.EncodeToString(sum.Sum(nil)), nil
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
	}
	return "", fmt.Errorf("%s: hashing stopped", path)
}

// cancel stops the hashing (the conversion failed) and waits for it.
func (h *inputHashes) cancel() {
	h.stop.Store(true)
	<-h.done
}

// patch waits for the hashes and writes them over the placeholders in each written safetensors
// file's header (same length, so nothing moves).
func (h *inputHashes) patch(dir string, files []string) error {
	start := time.Now()
	<-h.done
	h.waited = time.Since(start).Seconds()
	if h.err != nil {
		return h.err
	}
	for _, name := range files {
		if !strings.HasSuffix(name, ".safetensors") {
			continue
		}
		if err := h.patchFile(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

func (h *inputHashes) patchFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var prefix [8]byte
	if _, err := f.ReadAt(prefix[:], 0); err != nil {
		return err
	}
	header := make([]byte, binary.LittleEndian.Uint64(prefix[:]))
	if _, err := f.ReadAt(header, 8); err != nil {
		return err
	}
	for i, ph := range h.placeholders {
		if bytes.Count(header, []byte(ph)) != 1 {
			return fmt.Errorf("%s: the provenance placeholder for input %d is not in the header once", path, i)
		}
		header = bytes.Replace(header, []byte(ph), []byte(h.hashes[i]), 1)
	}
	if _, err := f.WriteAt(header, 8); err != nil {
		return err
	}
	return f.Sync()
}
