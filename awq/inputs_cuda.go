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
// that stream is synchronized.
type DeviceInputs struct {
	Cols, Stride int
	X            cuda.DevicePtr // kept rows [Rows, Cols]
	Rows         int

	dev     *cuda.Device
	mem     cuda.DevicePtr // X, then Σx² and Σ|x| (float64, Cols each)
	sq, abs cuda.DevicePtr
	capRows int
	tokens  int
}

// NewDeviceInputs allocates the inputs of a group of cols channels that will see at most
// tokens token rows, keeping every stride-th.
func NewDeviceInputs(dev *cuda.Device, cols, stride, tokens int) (*DeviceInputs, error) {
	stride = max(stride, 1)
	in := &DeviceInputs{Cols: cols, Stride: stride, dev: dev, capRows: (tokens + stride - 1) / stride}
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
	first := (in.Stride - in.tokens%in.Stride) % in.Stride
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
	sums := make([]float64, in.Cols)
	if err := in.dev.CopyFromDevice(cuda.Bytes(sums), in.abs); err != nil {
		return nil, err
	}
	m := make([]float32, in.Cols)
	for c, s := range sums {
		if math.IsNaN(s) || math.IsInf(s, 0) {
			return nil, fmt.Errorf("awq: non-finite activation in input channel %d", c)
		}
		m[c] = float32(s / float64(max(in.tokens, 1)))
	}
	return m, nil
}
