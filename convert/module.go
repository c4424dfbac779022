package convert

import (
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// rawLayout is one stored tensor of a packed module, known before any weight is quantized.
type rawLayout struct {
	Name  string
	DType safetensors.DType
	Shape []int
	size  int64
}

// layoutCache finds the stored tensors a format writes for a scheme and shape by packing a
// placeholder tensor of that shape once: the layout depends only on (scheme, N, K), and the
// safetensors header, written first, needs every shape before any data.
type layoutCache map[string][]rawLayout

func (c layoutCache) get(f packing.Format, prefix string, s quant.Scheme, n, k int) ([]rawLayout, error) {
	key := fmt.Sprintf("%s/%d/%d", s, n, k)
	suffixes, ok := c[key]
	if !ok {
		placeholder, err := blockwise.Quantize(make([]float32, n*k), n, k, s, blockwise.Options{})
		if err != nil {
			return nil, err
		}
		raws, err := f.Pack("", placeholder)
		if err != nil {
			return nil, err
		}
		for _, r := range raws {
			suffixes = append(suffixes, rawLayout{Name: r.Name, DType: safetensors.DType(r.DType), Shape: r.Shape, size: int64(len(r.Data))})
		}
		c[key] = suffixes
	}
	out := make([]rawLayout, len(suffixes))
	for i, r := range suffixes {
		r.Name = prefix + r.Name
		out[i] = r
	}
	return out, nil
}

// packedModule quantizes and packs one weight on demand: its stored tensors are written
// consecutively, the first write does the work and the last releases the bytes.
type packedModule struct {
	ck       *safetensors.Checkpoint
	item     Item
	format   packing.Format
	opt      Options
	layout   []rawLayout
	report   *TensorReport
	progress string
	packed   []packing.Raw
}

func (m *packedModule) tensor(i int) safetensors.WriterTensor {
	l := m.layout[i]
	return safetensors.WriterTensor{Name: l.Name, DType: l.DType, Shape: l.Shape, WriteTo: func(w io.Writer) error {
		if m.packed == nil {
			if err := m.run(); err != nil {
				return err
			}
		}
		_, err := w.Write(m.packed[i].Data)
		if i == len(m.layout)-1 {
			m.packed = nil
		}
		return err
	}}
}

// run quantizes the weight, measures its error, and packs it.
func (m *packedModule) run() error {
	start := time.Now()
	name := m.item.Info.Name
	t, err := quantizeWeight(m.ck, m.item, m.opt)
	if err != nil {
		return fmt.Errorf("tensor %s: %w", name, err)
	}
	relErr, err := measureError(m.ck, name, t)
	if err != nil {
		return err
	}
	m.ck.Release(name)
	raws, err := m.format.Pack(m.item.Module, t)
	if err != nil {
		return fmt.Errorf("tensor %s: %w", name, err)
	}
	if err := m.checkLayout(raws); err != nil {
		return err
	}
	m.packed = raws
	m.report.RelError = relErr
	m.report.Seconds = time.Since(start).Seconds()
	fmt.Fprintf(m.opt.Log, "%s %s %s %dx%d rel.err %.4f %.0fms\n", m.progress, m.item.Module, t.Scheme,
		t.N, t.K, relErr, 1000*m.report.Seconds)
	return nil
}

// checkLayout guards the promise the header made: the packer wrote exactly the planned tensors.
func (m *packedModule) checkLayout(raws []packing.Raw) error {
	if len(raws) != len(m.layout) {
		return fmt.Errorf("tensor %s: packer wrote %d tensors, planned %d", m.item.Info.Name, len(raws), len(m.layout))
	}
	for i, r := range raws {
		l := m.layout[i]
		if r.Name != l.Name || safetensors.DType(r.DType) != l.DType || !slices.Equal(r.Shape, l.Shape) || int64(len(r.Data)) != l.size {
			return fmt.Errorf("tensor %s: packer wrote %s %s %v, planned %s %s %v", m.item.Info.Name, r.Name, r.DType, r.Shape, l.Name, l.DType, l.Shape)
		}
	}
	return nil
}

// quantizeWeight runs the chosen method on one weight, reading BF16 without a float32 copy.
func quantizeWeight(ck *safetensors.Checkpoint, it Item, opt Options) (*quant.Tensor, error) {
	bopt := blockwise.Options{Clip: opt.Clip}
	n, k := it.N(), it.K()
	if it.Info.DType == safetensors.BF16 {
		raw, err := ck.Bytes(it.Info.Name)
		if err != nil {
			return nil, err
		}
		return blockwise.QuantizeBF16(raw, n, k, *it.Scheme, bopt)
	}
	w, err := ck.Float32(it.Info.Name)
	if err != nil {
		return nil, err
	}
	return blockwise.Quantize(w, n, k, *it.Scheme, bopt)
}

// measureError is ‖W − Ŵ‖_F / ‖W‖_F for the report.
func measureError(ck *safetensors.Checkpoint, name string, t *quant.Tensor) (float64, error) {
	w, err := ck.Float32(name)
	if err != nil {
		return 0, err
	}
	return quant.RelativeError(w, t.Dequantize(nil)), nil
}
