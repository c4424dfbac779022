package model

import (
	"github.com/qpack-dev/qpack/cuda"
)

// statsChunkRows is how many rows one block of channel_stats_partial sums: small enough that a
// few thousand blocks fill the GPU, large enough that the partial sums stay a few megabytes.
const statsChunkRows = 256

// AddChannelStats queues AddChannelStats on the engine's stream for x [rows, cols] (device,
// row-major float32): sq[j] += Σ x[r, j]², abs[j] += Σ |x[r, j]| with sq and abs device float64
// arrays of cols values (abs may be 0). A non-finite input makes the sums non-finite, which
// the caller checks once it downloads them.
func (e *GPU) AddChannelStats(sq, abs, x cuda.DevicePtr, rows, cols int) error {
	if rows == 0 {
		return nil
	}
	const threads = 256
	chunks := (rows + statsChunkRows - 1) / statsChunkRows
	psq, err := e.work("stats.sq", 8*chunks*cols)
	if err != nil {
		return err
	}
	pabs, err := e.work("stats.abs", 8*chunks*cols)
	if err != nil {
		return err
	}
	colBlocks := (cols + threads - 1) / threads
	if err := e.fn.channelStatsPartial.Launch(cuda.Dim3{X: colBlocks, Y: chunks, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, e.stream,
		x, int64(rows), int32(cols), int32(statsChunkRows), psq, pabs); err != nil {
		return err
	}
	return e.fn.channelStatsFinish.Launch(cuda.Dim3{X: colBlocks, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, e.stream,
		psq, pabs, int32(chunks), int32(cols), sq, abs)
}
