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
// tokens (Reset's start) and GPUSearch.Join gathers them where a search runs.
type DeviceInputs struct {
	Cols, Stride int
	X            cuda.DevicePtr // kept rows [Rows, Cols]
	Rows         int

	dev     *cuda.Device
	mem     cuda.DevicePtr // X, then Σx² and Σ|x| (float64, Cols each)
	sq, abs cuda.DevicePtr
	capRows int
	start   int // the index among all the calibration's tokens of the first row offered to Keep
	tokens  int // rows added to the channel sums
	offered int // rows offered to Keep
}

// NewDeviceInputs allocates the inputs of a group of cols channels that will see at most
// tokens token rows, keeping every stride-th (room for the rows kept of any tokens consecutive
// indices); the first row is token 0 until Reset says otherwise.
func NewDeviceInputs(dev *cuda.Device, cols, stride, tokens int) (*DeviceInputs, error) {
	stride = max(stride, 1)
	in := &DeviceInputs{Cols: cols, Stride: stride, dev: dev, capRows: (tokens + stride - 1) / stride}
	xBytes := (4*in.capRows*cols + 255) / 256 * 256
	var err error
	if in.mem, err = dev.Alloc(xBytes + 16*cols); err != nil {
		return nil, fmt.Errorf("awq: %d sampled input rows of %d channels on the GPU: %w", in.capRows, cols, err)
	}
	in.X, in.sq, in.abs = in.mem, in.mem.Add(xBytes), in.mem.Add(xBytes+8*cols)
	return in, in.Reset(0)
}

// Reset forgets every row added, for the next block; the rows offered from then on are the
// tokens from index start on among all the calibration's (a GPU's share of them: it keeps the
// rows whose index is a multiple of Stride, those one GPU would keep of all the tokens).
func (in *DeviceInputs) Reset(start int) error {
	in.Rows, in.tokens, in.offered, in.start = 0, 0, 0, start
	return in.dev.Fill32(in.sq, 0, 4*in.Cols) // Σx² and Σ|x|: 2·Cols float64 zeros
}

// Restart makes the rows offered from now on the tokens from index start on, those before it
// offered to no Keep yet (a GPU's tokens routed to an expert, whose first index is known once
// every GPU has routed them).
func (in *DeviceInputs) Restart(start int) error {
	if in.offered > 0 {
		return fmt.Errorf("awq: inputs restarted at token %d after %d rows were offered", start, in.offered)
	}
	in.start = start
	return nil
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
	if err := in.AddSums(e, x, rows); err != nil {
		return err
	}
	return in.Keep(e, g, x, rows)
}

// AddSums queues the channel sums of x [rows, Cols] on the engine's stream and counts its rows.
func (in *DeviceInputs) AddSums(e *model.GPU, x cuda.DevicePtr, rows int) error {
	if err := e.AddChannelStats(in.sq, in.abs, x, rows, in.Cols); err != nil {
		return err
	}
	in.tokens += rows
	return nil
}

// Keep queues, on the engine's stream, the copy of the rows of x [rows, Cols] whose index
// among all the calibration's tokens is a multiple of Stride (the rows offered run on over all
// calls from Reset's start).
func (in *DeviceInputs) Keep(e *model.GPU, g *GPUSearch, x cuda.DevicePtr, rows int) error {
	first := (in.Stride - (in.start+in.offered)%in.Stride) % in.Stride
	count := 0
	if first < rows {
		count = (rows - first + in.Stride - 1) / in.Stride
	}
	if in.Rows+count > in.capRows {
		return fmt.Errorf("awq: more calibration tokens than the %d the inputs were sized for", in.capRows*in.Stride)
	}
	if err := g.GatherRows(in.X.Add(4*in.Rows*in.Cols), x, in.Cols, first, in.Stride, count, e.Stream()); err != nil {
		return err
	}
	in.Rows += count
	in.offered += rows
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
