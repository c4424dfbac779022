package inspect

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/qpack-dev/qpack/gguf"
)

// isGGUF says whether path names a GGUF file.
func isGGUF(path string) bool { return strings.HasSuffix(strings.ToLower(path), ".gguf") }

// inspectGGUF reports a GGUF file: its tensors with their ggml types and PyTorch-order shapes,
// every block-quantized tensor as a module with its bits per weight (the decoder blocks' own
// total apart: what llama.cpp's file sizes compare), the metadata (arrays summarised), and the
// provenance qpack writes.
func inspectGGUF(path string) (*Report, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := &Report{Path: path, Files: []string{filepath.Base(path)}, ByDType: map[string]DTypeTotal{}, Metadata: map[string]string{}}
	for _, kv := range f.KVs {
		r.Metadata[kv.Key] = summarizeValue(kv.Value)
	}
	r.Architecture = r.Metadata["general.architecture"]
	r.ModelType = "gguf"
	q := &Quantization{Format: "gguf"}
	var blockParams, blockBytes int64
	for _, ti := range f.Tensors {
		shape := make([]int, len(ti.Dims))
		params := int64(1)
		for i, d := range ti.Dims {
			shape[len(ti.Dims)-1-i] = int(d)
			params *= int64(d)
		}
		t := Tensor{Name: ti.Name, DType: ti.Type.String(), Shape: shape, Params: params, Bytes: ti.Size, File: filepath.Base(path)}
		r.Tensors = append(r.Tensors, t)
		r.TotalParams += params
		r.TotalBytes += ti.Size
		d := r.ByDType[t.DType]
		d.Tensors++
		d.Params += params
		d.Bytes += ti.Size
		r.ByDType[t.DType] = d
		if ti.Type.BlockSize() > 1 {
			bpw := float64(8*ti.Size) / float64(params)
			q.Modules = append(q.Modules, Module{Name: ti.Name, Scheme: ti.Type.String(), Bits: int(bpw), GroupSize: ti.Type.BlockSize(),
				Shape: shape, Bytes: ti.Size, BPW: bpw})
			q.Params += params
			q.Bytes += ti.Size
		}
		if strings.HasPrefix(ti.Name, "blk.") && len(shape) == 2 {
			blockParams += params
			blockBytes += ti.Size
		}
	}
	if len(q.Modules) == 0 {
		return r, nil
	}
	q.BPW = float64(8*q.Bytes) / float64(q.Params)
	q.ModelParams = r.TotalParams
	q.ModelBPW = float64(8*r.TotalBytes) / float64(r.TotalParams)
	if blockParams > 0 {
		q.BlockBPW = float64(8*blockBytes) / float64(blockParams)
	}
	q.InputBytes = provenanceInputBytes(r.Metadata)
	if q.InputBytes > 0 && r.TotalBytes > 0 {
		q.Compression = float64(q.InputBytes) / float64(r.TotalBytes)
	}
	r.Quantization = q
	return r, nil
}

// summarizeValue writes a metadata value as text, arrays (a vocabulary has 100k entries) as
// their type, length and first elements.
func summarizeValue(v any) string {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice {
		return fmt.Sprint(v)
	}
	text := []rune(fmt.Sprint(v))
	if len(text) > 80 {
		text = append(text[:77], []rune("...")...)
	}
	return fmt.Sprintf("%s[%d] %s", rv.Type().Elem(), rv.Len(), string(text))
}
