package awq

import (
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/model"
)

// DeviceInputs is Inputs on the GPU: Σ|x| per input channel over every token, and every
// Stride-th token row kept in device memory for the searches. It is filled on the model
// engine's stream while the engine runs a block (model.GPUCalibrator.ObserveGPU) and read once
// that stream is synchronized. On several GPUs each GPU keeps the inputs of its share of the
// tokens (NewShardInputs) and GPUSearch.Join gathers them where a search runs.
type DeviceInputs struct {
	Cols, Stride int
	X            cuda.DevicePtr // kept rows [Rows, Cols]
	Rows         int

	dev     *cuda.Device
	mem     cuda.DevicePtr // X, then Σx² and Σ|x| (float64, Cols each)
	sq, abs cuda.DevicePtr
	capRows int
	start   int // the index of the first token among all the calibration's (a GPU's share)
	tokens  int
}

// NewDeviceInputs allocates the inputs of a group of cols channels that will see at most
// tokens token rows, keeping every stride-th.
func NewDeviceInputs(dev *cuda.Device, cols, stride, tokens int) (*DeviceInputs, error) {
	return NewShardInputs(dev, cols, stride, 0, tokens)
}

// NewShardInputs allocates the inputs of one GPU's share of the tokens, those from index start
// on (at most tokens of them): it keeps the rows whose index among all the calibration's tokens
// is a multiple of stride, the rows one GPU would keep of all the tokens.
func NewShardInputs(dev *cuda.Device, cols, stride, start, tokens int) (*DeviceInputs, error) {
	stride = max(stride, 1)
	ceil := func(n int) int { return (n + stride - 1) / stride }
	in := &DeviceInputs{Cols: cols, Stride: stride, dev: dev, capRows: ceil(start+tokens) - ceil(start), start: start}
	xBytes := (4*in.capRows*cols + 255) / 256 * 256
	var err error
	if in.mem, err = dev.Alloc(xBytes + 16*cols); err != nil {
		return nil, fmt.Errorf("awq: %d sampled input rows of %d channels on the GPU: %w", in.capRows, cols, err)
	}
	in.X, in.sq, in.abs = in.mem, in.mem.Add(xBytes), in.mem.Add(xBytes+8*cols)
	return in, in.Reset()
}

// Reset forgets every row added, for the next block.
func (in *DeviceInputs) Reset() error {
	in.Rows, in.tokens = 0, 0
	return in.dev.Fill32(in.sq, 0, 4*in.Cols) // Σx² and Σ|x|: 2·Cols float64 zeros
}

// Free releases the device memory.
func (in *DeviceInputs) Free() error {
	if in.mem == 0 {
		return nil
	}
	err := in.dev.Free(in.mem)
	in.mem = 0
	return err
}

// Add queues, on the engine's stream, the channel sums of x [rows, Cols] (device) and the copy of
// its kept rows (the token count runs on over all calls, as Inputs.Add's does).
func (in *DeviceInputs) Add(e *model.GPU, g *GPUSearch, x cuda.DevicePtr, rows int) error {
	first := (in.Stride - (in.start+in.tokens)%in.Stride) % in.Stride
	count := 0
	if first < rows {
		count = (rows - first + in.Stride - 1) / in.Stride
	}
	if in.Rows+count > in.capRows {
		return fmt.Errorf("awq: more calibration tokens than the %d the inputs were sized for", in.capRows*in.Stride)
	}
	if err := e.AddChannelStats(in.sq, in.abs, x, rows, in.Cols); err != nil {
		return err
	}
	if err := g.GatherRows(in.X.Add(4*in.Rows*in.Cols), x, in.Cols, first, in.Stride, count, e.Stream()); err != nil {
		return err
	}
	in.Rows += count
	in.tokens += rows
	return nil
}

// Tokens is how many token rows were added.
func (in *DeviceInputs) Tokens() int { return in.tokens }

// MeanAbs downloads mean |x| per input channel (the engine's stream must be synchronized). A
// non-finite sum means a NaN or infinite activation reached the channel: an error naming it.
func (in *DeviceInputs) MeanAbs() ([]float32, error) {
	sums, err := in.sums()
	if err != nil {
		return nil, err
	}
	sums = sums[in.Cols:] // Σ|x|
	m := make([]float32, in.Cols)
	for c, s := range sums {
		if math.IsNaN(s) || math.IsInf(s, 0) {
			return nil, fmt.Errorf("awq: non-finite activation in input channel %d", c)
		}
		m[c] = float32(s / float64(max(in.tokens, 1)))
	}
	return m, nil
}

// sums downloads Σx² and Σ|x| (Cols float64 each, in that order).
func (in *DeviceInputs) sums() ([]float64, error) {
	sums := make([]float64, 2*in.Cols)
	return sums, in.dev.CopyFromDevice(cuda.Bytes(sums), in.sq)
}

// Join makes dst (on the search's GPU, empty) the inputs of all the tokens that parts (every
// GPU's share, in the order of the tokens, each GPU's work on them finished) saw: their kept rows
// one after another, copied over NVLink or PCIe on the search's stream, and their channel sums
// added up in order on the host.
func (g *GPUSearch) Join(dst *DeviceInputs, parts []*DeviceInputs) error {
	if dst.dev != g.dev {
		return fmt.Errorf("awq: joining inputs on GPU %d with GPU %d's search", dst.dev.Info().Ordinal, g.dev.Info().Ordinal)
	}
	total := make([]float64, 2*dst.Cols)
	dst.Rows, dst.tokens = 0, 0
	for _, p := range parts {
		if p.Cols != dst.Cols || dst.Rows+p.Rows > dst.capRows {
			return fmt.Errorf("awq: joining %d rows of %d channels into inputs of %d channels with room for %d more", p.Rows, p.Cols, dst.Cols, dst.capRows-dst.Rows)
		}
		if p.Rows > 0 {
			if err := dst.dev.CopyFromPeerAsync(dst.X.Add(4*dst.Rows*dst.Cols), p.dev, p.X, 4*p.Rows*p.Cols, g.stream); err != nil {
				return err
			}
		}
		sums, err := p.sums()
		if err != nil {
			return err
		}
		for i, v := range sums {
			total[i] += v
		}
		dst.Rows += p.Rows
		dst.tokens += p.tokens
	}
	return g.stager.CopyToDevice(dst.sq, cuda.Bytes(total), g.stream)
}

// Device is the GPU the inputs are on.
func (in *DeviceInputs) Device() *cuda.Device { return in.dev }
