package convert

import (
	"fmt"
	"slices"
	"time"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/gguf"
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
		var err error
		if suffixes, err = placeholderLayout(f, s, n, k); err != nil {
			return nil, err
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

// placeholderLayout packs a placeholder tensor of scheme s and shape n×k in f and returns what
// f stored; GGUF knows it without packing (tens of milliseconds for each of a 7B's shapes).
func placeholderLayout(f packing.Format, s quant.Scheme, n, k int) ([]rawLayout, error) {
	if g, ok := f.(packing.GGUF); ok {
		r, err := g.Layout("", s, n, k)
		if err != nil {
			return nil, err
		}
		return []rawLayout{{Name: r.Name, DType: safetensors.DType(r.DType), Shape: r.Shape, size: int64(r.Shape[0]) * int64(r.Shape[1])}}, nil
	}
	raws, err := f.Pack("", placeholderTensor(s, n, k))
	if err != nil {
		return nil, err
	}
	var out []rawLayout
	for _, r := range raws {
		out = append(out, rawLayout{Name: r.Name, DType: safetensors.DType(r.DType), Shape: r.Shape, size: int64(len(r.Data))})
	}
	return out, nil
}

// placeholderTensor is a valid quantized tensor of the scheme and shape with all-zero codes.
func placeholderTensor(s quant.Scheme, n, k int) *quant.Tensor {
	if s.Grid == quant.KQuant {
		return quant.NewKQuantTensor(s, n, k)
	}
	if s.Grid == quant.IQuant {
		return quant.NewIQuantTensor(s, n, k)
	}
	groups := s.Groups(k)
	if s.Grid == quant.FP8E4M3 {
		groups = 1
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k), Scales: make([]float32, n*groups)}
	for i := range t.Scales {
		t.Scales[i] = 1
	}
	if s.Grid == quant.NVFP4 {
		t.GlobalScale = 1
	}
	switch {
	case s.Grid == quant.Integer:
		t.Zeros = make([]uint8, n*groups)
		if s.Sym {
			for i := range t.Zeros {
				t.Zeros[i] = uint8(1 << (s.Bits - 1))
			}
		}
	case s.Grid == quant.Binary && !s.Sym:
		t.Offsets = make([]float32, n*groups)
	}
	return t
}

// packedModule quantizes, packs and writes one weight.
type packedModule struct {
	ck       *safetensors.Checkpoint
	item     Item
	format   packing.Format
	opt      Options
	gpu      *gpu
	gptq     *blockRunner // set for --method gptq: the tensor comes from the calibration run
	layout   []rawLayout
	report   *TensorReport
	writes   *writeTimer
	progress string
}

// write quantizes and packs the weight (on the GPU when it can), measures its error when
// asked, and writes its packed tensors.
func (m *packedModule) write(out tensorSink) error {
	start := time.Now()
	var writing time.Duration
	name := m.item.Info.Name
	device, err := m.quantizePack(func(raws []packing.Raw, t *quant.Tensor) error {
		if err := m.checkLayout(raws); err != nil {
			return err
		}
		if m.opt.MeasureError {
			if err := m.measureError(raws, t); err != nil {
				return err
			}
		}
		writeStart := time.Now()
		defer func() { writing = time.Since(writeStart) }()
		for _, r := range raws {
			if err := m.writes.write(out, r.Name, r.Data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("tensor %s: %w", name, err)
	}
	m.ck.Release(name)
	m.report.Seconds = (time.Since(start) - writing).Seconds()
	m.report.Device = device
	line := fmt.Sprintf("%s %s %s %dx%d on %s", m.progress, m.item.Module, m.item.Scheme, m.item.N(), m.item.K(), device)
	if m.opt.MeasureError {
		line += fmt.Sprintf(" rel.err %.4f", m.report.RelError)
	}
	fmt.Fprintf(m.opt.Log, "%s %.0fms\n", line, 1000*m.report.Seconds) // one write: modules log concurrently
	return nil
}

// measureError sets the report's ‖W − Ŵ‖/‖W‖, unpacking the packed tensors when the method
// did not return the quantized tensor.
func (m *packedModule) measureError(raws []packing.Raw, t *quant.Tensor) error {
	var err error
	if t == nil {
		if t, err = m.format.Unpack(m.item.Module, byName(raws), m.metadata()); err != nil {
			return err
		}
	}
	m.report.RelError, err = measureError(m.ck, m.item.Info.Name, t)
	return err
}

// quantizePack runs the fused GPU kernel when it supports the scheme and layout (its packed
// tensors are views of pinned memory, valid only during use), else the GPU's k-quant fit or
// --imatrix search when they apply, else the CPU method, each of these followed by the format's
// packer (which also returns the quant.Tensor), and hands the packed tensors to use. It returns
// the device that quantized.
func (m *packedModule) quantizePack(use func([]packing.Raw, *quant.Tensor) error) (string, error) {
	s := *m.item.Scheme
	switch {
	case m.gptq != nil:
		return m.packTensor(m.gptq.deviceFor(s), func() (*quant.Tensor, error) { return m.gptq.result(m.item.Module) }, use)
	case isGGUF(m.format) && ggmltype.IsLegacy(s) && m.encodesLegacy():
		return DeviceCPU, m.encodeLegacy(use)
	case isGGUF(m.format) && ggmltype.IsLegacy(s):
		return m.packTensor(DeviceCPU, m.quantizeLegacy, use)
	case m.gpu.fitsBlocks(m.item, m.format, m.opt):
		return DeviceCUDA, m.fitBlocksOnGPU(use)
	case m.gpu.supports(s, m.format, m.opt):
		name := m.item.Info.Name
		fill := func(dst []byte) error { return m.ck.ReadInto(name, dst) }
		err := m.gpu.q.QuantizePackScaled(fill, string(m.item.Info.DType), m.item.N(), m.item.K(), s, m.format.Name(), m.item.Module,
			m.opt.globals[m.item.Module], func(raws []packing.Raw) error { return use(raws, nil) })
		return DeviceCUDA, err
	case m.gpu.fits(s, m.opt):
		return m.packTensor(DeviceCUDA, m.fitKQuantOnGPU, use)
	case m.gpu.searches(s, m.opt):
		return m.packTensor(DeviceCUDA+" (search) and cpu", m.quantizeSearchedOnGPU, use)
	}
	raws, t, err := m.quantizePackCPU()
	if err != nil {
		return "", err
	}
	return DeviceCPU, use(raws, t)
}

// packTensor packs the tensor quantize makes in the module's format and hands it to use; device
// is where it was quantized.
func (m *packedModule) packTensor(device string, quantize func() (*quant.Tensor, error), use func([]packing.Raw, *quant.Tensor) error) (string, error) {
	t, err := quantize()
	if err != nil {
		return "", err
	}
	raws, err := m.format.Pack(m.item.Module, t)
	if err != nil {
		return "", err
	}
	return device, use(raws, t)
}

// quantizeLegacy fits a GGUF Q8_0, Q5_0 or Q4_0 tensor by round-to-nearest as llama-quantize
// does (with the importance under --imatrix).
func (m *packedModule) quantizeLegacy() (*quant.Tensor, error) {
	w, err := m.ck.Float32(m.item.Info.Name)
	if err != nil {
		return nil, err
	}
	return ggmltype.QuantizeLegacy(w, m.item.N(), m.item.K(), *m.item.Scheme, m.opt.blockwise(m.item.Module).Importance)
}

// encodesLegacy says whether encodeLegacy applies: no importance (which Q8_0 ignores anyway)
// and no error to measure, which needs the tensor.
func (m *packedModule) encodesLegacy() bool {
	typ, _ := ggmltype.TypeOf(*m.item.Scheme)
	return (m.opt.blockwise(m.item.Module).Importance == nil || typ == gguf.Q8_0) && !m.opt.MeasureError
}

// encodeLegacy writes a GGUF Q8_0, Q5_0 or Q4_0 tensor fitted without importance straight from
// the weights, converted a row at a time: the bytes of quantizeLegacy's tensor packed.
func (m *packedModule) encodeLegacy(use func([]packing.Raw, *quant.Tensor) error) error {
	raw, err := m.ck.Bytes(m.item.Info.Name)
	if err != nil {
		return err
	}
	s, n, k, dtype := *m.item.Scheme, m.item.N(), m.item.K(), m.item.Info.DType
	rowBytes := len(raw) / n
	b, err := ggmltype.EncodeLegacy(s, n, k, func(r int, buf []float32) ([]float32, error) {
		return buf, safetensors.DecodeFloat32(dtype, buf, raw[r*rowBytes:(r+1)*rowBytes])
	})
	if err != nil {
		return err
	}
	raws, err := packing.GGUF{}.Blocks(m.item.Module, s, n, k, b)
	if err != nil {
		return err
	}
	return use(raws, nil)
}

// quantizeSearchedOnGPU runs the --imatrix search of every group on the GPU and encodes the
// groups with the parameters found on the CPU: the tensor the CPU alone would make.
func (m *packedModule) quantizeSearchedOnGPU() (*quant.Tensor, error) {
	w, err := m.ck.Float32(m.item.Info.Name)
	if err != nil {
		return nil, err
	}
	n, k, s := m.item.N(), m.item.K(), *m.item.Scheme
	bopt := m.opt.blockwise(m.item.Module)
	if bopt.Params, err = m.gpu.imatrix.Params(w, n, k, s, bopt.Importance); err != nil {
		return nil, err
	}
	return blockwise.Quantize(w, n, k, s, bopt)
}

// fitBlocksOnGPU reads a k-quant weight as stored straight into the GPU fitter's pinned memory,
// and hands use the ggml blocks the GPU fitted and packed, where they lie in pinned memory: the
// bytes packing.GGUF's Pack makes of the CPU's tensor.
func (m *packedModule) fitBlocksOnGPU(use func([]packing.Raw, *quant.Tensor) error) error {
	it := m.item
	fill := func(dst []byte) error { return m.ck.ReadInto(it.Info.Name, dst) }
	return m.gpu.kq.FitBlocks(fill, gpuDTypes[it.Info.DType], it.N(), it.K(), *it.Scheme, m.opt.blockwise(it.Module).Importance,
		func(blocks []byte) error {
			raws, err := packing.GGUF{}.Blocks(it.Module, *it.Scheme, it.N(), it.K(), blocks)
			if err != nil {
				return err
			}
			return use(raws, nil)
		})
}

// fitKQuantOnGPU fits every super-block of a k-quant weight (every block of an IQ one) on the
// GPU, with its importance under --imatrix: the tensor the CPU would make, bit for bit. A
// k-quant weight is read as stored straight into the fitter's pinned memory.
func (m *packedModule) fitKQuantOnGPU() (*quant.Tensor, error) {
	it, s := m.item, *m.item.Scheme
	imp := m.opt.blockwise(it.Module).Importance
	if dtype, ok := gpuDTypes[it.Info.DType]; ok && s.Grid == quant.KQuant {
		return m.gpu.kq.QuantizeRaw(func(dst []byte) error { return m.ck.ReadInto(it.Info.Name, dst) }, dtype, it.N(), it.K(), s, imp)
	}
	w, err := m.ck.Float32(it.Info.Name)
	if err != nil {
		return nil, err
	}
	if s.Grid == quant.IQuant {
		return m.gpu.iq.Quantize(w, it.N(), it.K(), s, imp)
	}
	return m.gpu.kq.Quantize(w, it.N(), it.K(), s, imp)
}

// quantizePackCPU quantizes and packs on the CPU; t is nil when the fused path packed directly.
func (m *packedModule) quantizePackCPU() ([]packing.Raw, *quant.Tensor, error) {
	s := *m.item.Scheme
	if f, ok := m.format.(packing.GPTQ); ok && m.item.Info.DType == safetensors.BF16 {
		// Quantize and pack in one pass, a block of rows at a time (same bytes, no code array).
		raw, err := m.ck.Bytes(m.item.Info.Name)
		if err != nil {
			return nil, nil, err
		}
		raws, err := blockwise.QuantizeBF16PackGPTQ(nil, new(quant.Tensor), f, m.item.Module, raw, m.item.N(), m.item.K(), s, m.opt.blockwise(m.item.Module))
		return raws, nil, err
	}
	t, err := quantizeWeight(m.ck, m.item, m.opt)
	if err != nil {
		return nil, nil, err
	}
	raws, err := m.format.Pack(m.item.Module, t)
	return raws, t, err
}

// metadata is what the format's Unpack needs to read this module back.
func (m *packedModule) metadata() map[string]string {
	meta := packing.Config{Format: m.format.Name(), Scheme: *m.item.Scheme}.Meta()
	for k, v := range m.format.Metadata(m.item.Module, &quant.Tensor{Scheme: *m.item.Scheme}) {
		meta[k] = v
	}
	return meta
}

func byName(raws []packing.Raw) func(string) (packing.Raw, bool) {
	return func(name string) (packing.Raw, bool) {
		for _, r := range raws {
			if r.Name == name {
				return r, true
			}
		}
		return packing.Raw{}, false
	}
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
	bopt := opt.blockwise(it.Module)
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
