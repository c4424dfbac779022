// Package inspect describes a checkpoint from its headers alone: architecture, tensors with
// dtypes, shapes and sizes, totals per dtype, and file metadata.
package inspect

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/qpack-dev/qpack/quantized"
)

// Tensor is one row of the report.
type Tensor struct {
	Name   string `json:"name"`
	DType  string `json:"dtype"`
	Shape  []int  `json:"shape"`
	Params int64  `json:"params"`
	Bytes  int64  `json:"bytes"`
	File   string `json:"file"`
}

// DTypeTotal sums the tensors of one dtype.
type DTypeTotal struct {
	Tensors int   `json:"tensors"`
	Params  int64 `json:"params"`
	Bytes   int64 `json:"bytes"`
}

// Report is what `qpack inspect` prints.
type Report struct {
	Path         string                `json:"path"`
	Architecture string                `json:"architecture,omitempty"`
	ModelType    string                `json:"model_type,omitempty"`
	Files        []string              `json:"files"`
	Tensors      []Tensor              `json:"tensors"`
	TotalParams  int64                 `json:"total_params"`
	TotalBytes   int64                 `json:"total_bytes"`
	ByDType      map[string]DTypeTotal `json:"by_dtype"`
	Metadata     map[string]string     `json:"metadata"`
	Quantization *Quantization         `json:"quantization,omitempty"`
}

// Module is one quantized weight: its scheme and what it costs on disk.
type Module struct {
	Name      string  `json:"name"` // module prefix
	Scheme    string  `json:"scheme"`
	Bits      int     `json:"bits"`
	GroupSize int     `json:"group_size"` // 0: one group per output channel
	Shape     []int   `json:"shape"`      // [N, K] of the weight it stands for
	Bytes     int64   `json:"bytes"`      // codes, scales, zeros and g_idx
	BPW       float64 `json:"bpw"`
}

// Quantization summarises a quantized checkpoint.
type Quantization struct {
	Format      string   `json:"format"`
	Modules     []Module `json:"modules"`
	Params      int64    `json:"quantized_params"`
	Bytes       int64    `json:"quantized_bytes"`
	BPW         float64  `json:"quantized_bpw"` // average over the quantized weights
	ModelParams int64    `json:"model_params"`  // logical parameters: quantized weights plus the rest
	ModelBPW    float64  `json:"model_bpw"`     // all stored bytes over all logical parameters
	// BlockBPW is a GGUF file's bits per weight over the decoder blocks' 2-D weights, the
	// figure llama.cpp's file types are compared by (0 for other checkpoints).
	BlockBPW float64 `json:"block_bpw,omitempty"`
	// InputBytes is the size of the checkpoint it was made from (from qpack's provenance), and
	// Compression = InputBytes / stored bytes; both are zero when unknown.
	InputBytes  int64   `json:"input_bytes,omitempty"`
	Compression float64 `json:"compression,omitempty"`
}

// Inspect reads the headers of the checkpoint at path (a file or a directory, or a GGUF
// file); no tensor data is read.
func Inspect(path string) (*Report, error) {
	if isGGUF(path) {
		return inspectGGUF(path)
	}
	ck, err := quantized.Open(path)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	r := &Report{Path: path, ByDType: map[string]DTypeTotal{}, Metadata: ck.Metadata()}
	for _, f := range ck.Files() {
		r.Files = append(r.Files, filepath.Base(f))
	}
	for _, name := range ck.Checkpoint.Names() {
		info, _ := ck.Info(name)
		t := Tensor{Name: name, DType: string(info.DType), Shape: info.Shape, Params: info.NumElements(),
			Bytes: info.Size, File: filepath.Base(info.File)}
		r.Tensors = append(r.Tensors, t)
		r.TotalParams += t.Params
		r.TotalBytes += t.Bytes
		d := r.ByDType[t.DType]
		d.Tensors++
		d.Params += t.Params
		d.Bytes += t.Bytes
		r.ByDType[t.DType] = d
	}
	if r.Architecture, r.ModelType, err = readArchitecture(ck.Dir); err != nil {
		return nil, err
	}
	if ck.Format != nil {
		if r.Quantization, err = summarize(ck, r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// summarize lists the quantized modules with their schemes and bits per weight.
func summarize(ck *quantized.Checkpoint, r *Report) (*Quantization, error) {
	q := &Quantization{Format: ck.Format.Name(), ModelParams: r.TotalParams}
	for _, prefix := range ck.Modules() {
		m, err := ck.Module(prefix)
		if err != nil {
			return nil, err
		}
		q.Modules = append(q.Modules, Module{Name: prefix, Scheme: m.Scheme.String(), Bits: m.Scheme.Bits,
			GroupSize: m.Scheme.GroupSize, Shape: []int{m.N, m.K}, Bytes: m.Bytes, BPW: m.BPW()})
		params := int64(m.N) * int64(m.K)
		q.Params += params
		q.Bytes += m.Bytes
		for _, name := range m.Stored {
			info, _ := ck.Info(name)
			q.ModelParams -= info.NumElements()
		}
		q.ModelParams += params
	}
	if q.Params > 0 {
		q.BPW = float64(8*q.Bytes) / float64(q.Params)
	}
	if q.ModelParams > 0 {
		q.ModelBPW = float64(8*r.TotalBytes) / float64(q.ModelParams)
	}
	q.InputBytes = provenanceInputBytes(r.Metadata)
	if q.InputBytes > 0 && r.TotalBytes > 0 {
		q.Compression = float64(q.InputBytes) / float64(r.TotalBytes)
	}
	return q, nil
}

// provenanceInputBytes sums the input file sizes qpack recorded, or returns 0.
func provenanceInputBytes(meta map[string]string) int64 {
	var prov struct {
		Inputs []struct {
			Bytes int64 `json:"bytes"`
		} `json:"inputs"`
	}
	if json.Unmarshal([]byte(meta["qpack.provenance"]), &prov) != nil {
		return 0
	}
	var total int64
	for _, in := range prov.Inputs {
		total += in.Bytes
	}
	return total
}

// readArchitecture takes the architecture and model type from config.json when there is one;
// a config.json that is not a JSON object is an error naming it, since no loader could use the
// checkpoint.
func readArchitecture(dir string) (arch, modelType string, err error) {
	path := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", nil
	}
	if err != nil {
		return "", "", err
	}
	var cfg struct {
		Architectures []string `json:"architectures"`
		ModelType     string   `json:"model_type"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return "", "", fmt.Errorf("%s: invalid JSON: %w", path, err)
	}
	return strings.Join(cfg.Architectures, ","), cfg.ModelType, nil
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report as aligned tables for people.
func (r *Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "%s\n", r.Path)
	if r.Architecture != "" {
		fmt.Fprintf(w, "architecture: %s (%s)\n", r.Architecture, r.ModelType)
	}
	fmt.Fprintf(w, "files: %s\n\n", strings.Join(r.Files, ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "name\tdtype\tshape\tparams\tbytes\tfile\t")
	for _, t := range r.Tensors {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", t.Name, t.DType, shapeString(t.Shape),
			thousands(t.Params), thousands(t.Bytes), t.File)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d tensors, %s parameters, %s bytes (%s)\n", len(r.Tensors), thousands(r.TotalParams),
		thousands(r.TotalBytes), humanBytes(r.TotalBytes))
	dtypes := make([]string, 0, len(r.ByDType))
	for d := range r.ByDType {
		dtypes = append(dtypes, d)
	}
	sort.Strings(dtypes)
	for _, d := range dtypes {
		t := r.ByDType[d]
		fmt.Fprintf(w, "  %-8s %4d tensors  %15s params  %15s bytes\n", d, t.Tensors, thousands(t.Params), thousands(t.Bytes))
	}
	if q := r.Quantization; q != nil {
		fmt.Fprintf(w, "\nquantized modules (%s format):\n", q.Format)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "module\tscheme\tshape\tbytes\tbits/weight\t")
		for _, m := range q.Modules {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.3f\t\n", m.Name, m.Scheme, shapeString(m.Shape), thousands(m.Bytes), m.BPW)
		}
		tw.Flush()
		fmt.Fprintf(w, "%d quantized modules: %s weights in %s bytes, %.3f bits/weight (scales, zeros and g_idx included)\n",
			len(q.Modules), thousands(q.Params), thousands(q.Bytes), q.BPW)
		if q.BlockBPW > 0 {
			fmt.Fprintf(w, "decoder blocks' weights: %.3f bits/weight\n", q.BlockBPW)
		}
		fmt.Fprintf(w, "whole checkpoint: %s logical parameters, %.3f bits/weight", thousands(q.ModelParams), q.ModelBPW)
		if q.Compression > 0 {
			fmt.Fprintf(w, ", %.2f× smaller than its %s-byte input", q.Compression, thousands(q.InputBytes))
		}
		fmt.Fprintln(w)
	}
	if len(r.Metadata) > 0 {
		fmt.Fprintln(w, "\nmetadata:")
		keys := make([]string, 0, len(r.Metadata))
		for k := range r.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := r.Metadata[k]
			if k == "qpack.provenance" {
				v = fmt.Sprintf("(%d bytes of JSON; see --json)", len(v))
			}
			if len(v) > 200 {
				v = v[:200] + fmt.Sprintf("… (%d bytes)", len(v))
			}
			fmt.Fprintf(w, "  %s: %s\n", k, v)
		}
	}
	return nil
}

func shapeString(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// thousands formats n with comma separators: 12,587,904.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
