package convert

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/internal/b3sum"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

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
	if q, done := cfg["quantization_config"]; done {
		// A block FP8 release is read as its float weights (quantized.OpenSource): its config
		// gives way to the output's.
		if qb, _ := json.Marshal(q); !isBlockFP8(qb) {
			return nil, fmt.Errorf("%s is already quantized (config.json has a quantization_config)", dir)
		}
		delete(cfg, "quantization_config")
	}
	return cfg, nil
}

// isBlockFP8 says whether a quantization_config is a block FP8 release's.
func isBlockFP8(q []byte) bool {
	c, err := packing.ParseConfig(q)
	return err == nil && c.Format == "fp8"
}

// quantConfig describes the output for the format's quantization_config.
func quantConfig(f packing.Format, items []Item) packing.Config {
	main, _, _ := mainScheme(items)
	c := packing.Config{Format: f.Name(), Scheme: main}
	for _, it := range items {
		isWeight := strings.HasSuffix(it.Info.Name, ".weight") && len(it.Info.Shape) == 2
		if it.Scheme == nil && isWeight && keptLinear(it) {
			c.Ignore = append(c.Ignore, it.Module)
		}
		if it.Scheme != nil && it.Role == model.RoleClassifier {
			c.LMHead = true
		}
	}
	return c
}

// keptLinear says whether an item is a linear module that loaders would quantize unless told
// not to: a decoder linear, lm_head, a mixture of experts' router, a shared expert's gate.
func keptLinear(it Item) bool {
	switch it.Role {
	case model.RoleClassifier, model.RoleRouter:
		return true
	case model.RoleOther:
		return strings.HasSuffix(it.Module, ".shared_expert_gate")
	}
	return it.Role.IsLinear()
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

// runtimeFile says whether a file beside the weights is one a runtime loading the output needs:
// the tokenizer's files, the generation config and chat template, remote code, the licence and
// the model card. Evaluation data, probes and other weights containers are not copied.
func runtimeFile(name string) bool {
	switch name {
	case "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
		"vocab.json", "vocab.txt", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
		"generation_config.json", "chat_template.json", "chat_template.jinja", "README.md", "NOTICE", "USE_POLICY.md":
		return true
	}
	upper := strings.ToUpper(name)
	return strings.HasPrefix(upper, "LICENSE") || strings.HasPrefix(upper, "LICENCE") ||
		slices.Contains([]string{".py", ".tiktoken", ".jinja"}, filepath.Ext(name))
}

// copyAuxFiles copies the runtime files (runtimeFile) of src into dst and logs what else it leaves out.
func copyAuxFiles(src, dst string, log io.Writer) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	var skipped []string
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(name, ".") || name == "config.json" ||
			name == "quantize_config.json" || name == safetensors.IndexName || strings.HasSuffix(name, ".safetensors") {
			continue
		}
		if !runtimeFile(name) {
			skipped = append(skipped, name)
			continue
		}
		if err := copyFile(filepath.Join(src, name), filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	if len(skipped) > 0 {
		fmt.Fprintf(log, "not copied (not needed to load the model): %s\n", strings.Join(skipped, ", "))
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

// InputFile identifies one input file by name, size and digest (one of them, as Options.InputHash
// says; none with HashNone).
type InputFile struct {
	Name   string `json:"name"`
	Bytes  int64  `json:"bytes"`
	BLAKE3 string `json:"blake3,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

// Input hashes (Options.InputHash).
const (
	// HashBLAKE3, the default: a tree hash that uses every core, so that it keeps up with the
	// conversion; `b3sum` prints the same digest.
	HashBLAKE3 = "blake3"
	// HashSHA256 is what `sha256sum` and the Hugging Face Hub (a file's LFS oid) print; it is
	// sequential, so the largest input file bounds the time (≈ 1.4 GB/s on a Xeon core).
	HashSHA256 = "sha256"
	// HashNone records names and sizes only.
	HashNone = "none"
)

func checkInputHash(name string) error {
	switch name {
	case HashBLAKE3, HashSHA256, HashNone:
		return nil
	}
	return fmt.Errorf("input hash %q is not available (available: %s, %s, %s)", name, HashBLAKE3, HashSHA256, HashNone)
}

// set stores a digest in the field of its algorithm.
func (in *InputFile) set(algo, digest string) {
	switch algo {
	case HashBLAKE3:
		in.BLAKE3 = digest
	case HashSHA256:
		in.SHA256 = digest
	}
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
	prov := Provenance{Tool: "qpack", Version: opt.Version, Method: opt.Method.String(), Format: f.Name(), Plan: plan,
		Calibration: calib, Options: map[string]any{"clip": opt.Clip, "imatrix": opt.Imatrix}}
	if calib != nil && opt.Plan == nil && opt.Alloc.Strategy == alloc.StrategyBudget {
		prov.Options["output_probe"] = opt.OutputProbe
	}
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

// inputHashes computes the inputs' digests while the conversion runs, so that reading the
// inputs twice costs little wall time. The output header is sized with a placeholder of a
// digest's length for each input; the final header, written when the output is committed,
// carries the digests.
type inputHashes struct {
	algo    string
	paths   []string
	inputs  []InputFile // digests hold the placeholders
	hashes  []string
	err     error
	done    chan struct{}
	stop    atomic.Bool
	seconds float64 // hashing, start to end
	waited  float64 // the conversion waiting for the hashes: the hashing's share of the critical path
}

// digestHexLen is the length of both algorithms' hex digests (256 bits).
const digestHexLen = 64

// startHashing starts hashing every input file, several at a time, the largest first: a file's
// digest is computed in order, so the largest file bounds the hashing time.
func startHashing(paths []string, algo string) (*inputHashes, error) {
	h := &inputHashes{algo: algo, paths: paths, hashes: make([]string, len(paths)), done: make(chan struct{})}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	for i, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		in := InputFile{Name: filepath.Base(p), Bytes: st.Size()}
		ph := fmt.Sprintf("pending-%s-%x-%d-", algo, nonce, i)
		in.set(algo, ph+strings.Repeat(".", digestHexLen-len(ph)))
		h.inputs = append(h.inputs, in)
	}
	if algo == HashNone {
		close(h.done)
		return h, nil
	}
	go h.run()
	return h, nil
}

func (h *inputHashes) run() {
	defer close(h.done)
	start := time.Now()
	errs := make([]error, len(h.paths))
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(4, runtime.NumCPU()/2))
	for _, i := range h.largestFirst() {
		wg.Add(1)
		sem <- struct{}{} // taken in order, so that the largest files start first
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			h.hashes[i], errs[i] = h.hashFile(h.paths[i])
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

// bytes is the size of the inputs hashed.
func (h *inputHashes) bytes() int64 {
	if h.algo == HashNone {
		return 0
	}
	var n int64
	for _, in := range h.inputs {
		n += in.Bytes
	}
	return n
}

// hashFile hashes one file: BLAKE3 on every core through b3sum, which reads the file in pieces
// that are hashed while they are in the cache; SHA-256, which is sequential, through a
// read-only mapping, so that the page cache's pages are hashed where they lie.
func (h *inputHashes) hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if h.algo == HashBLAKE3 {
		sum, err := b3sum.Sum(f, st.Size(), runtime.NumCPU(), h.stop.Load)
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		return sum, nil
	}
	sum := sha256.New()
	if st.Size() == 0 {
		return hex.EncodeToString(sum.Sum(nil)), nil
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return "", fmt.Errorf("%s: mmap: %w", path, err)
	}
	defer syscall.Munmap(data)
	const piece = 64 << 20 // between pieces, look whether the conversion failed
	for at := 0; at < len(data); at += piece {
		if h.stop.Load() {
			return "", fmt.Errorf("%s: hashing stopped", path)
		}
		p := data[at:min(at+piece, len(data))]
		sum.Write(p)
		syscall.Madvise(p, syscall.MADV_DONTNEED) // out of the resident set; the page cache keeps it
	}
	return hex.EncodeToString(sum.Sum(nil)), nil
}

// cancel stops the hashing (the conversion failed) and waits for it.
func (h *inputHashes) cancel() {
	h.stop.Store(true)
	<-h.done
}

// wait waits for the hashes and returns the inputs with their digests.
func (h *inputHashes) wait() ([]InputFile, error) {
	start := time.Now()
	<-h.done
	h.waited = time.Since(start).Seconds()
	if h.err != nil {
		return nil, h.err
	}
	out := slices.Clone(h.inputs)
	if h.algo != HashNone {
		for i := range out {
			out[i].set(h.algo, h.hashes[i])
		}
	}
	return out, nil
}
