package model

import (
	"errors"
	"fmt"

	"github.com/qpack-dev/qpack/cuda"
)

// GPUCalibrator is a Calibrator whose statistics are gathered on the GPU.
type GPUCalibrator interface {
	// ObserveGPU receives the input x [rows, cols] (device memory, row-major) of group g of
	// block `block` for a chunk of calibration sequences (rows = sequences × length). Work
	// queued on the engine's stream (GPU.Stream, GPU.AddGram) reads x before it is reused.
	ObserveGPU(block int, g Group, x cuda.DevicePtr, rows, cols int) error
	// Update is Calibrator.Update: it may replace the groups' weights through Linear.SetWeight;
	// the engine uploads the block again afterwards.
	Update(b *Block, groups []Group) error
}

// CalibrateGPU is Calibrate with the forward passes on the GPU: the hidden states of every
// calibration sequence and one block's weights are resident there; the host reads the next
// block while the GPU works on this one.
func (e *GPU) Calibrate(m *Model, seqs [][]int, c GPUCalibrator, opt CalibrateOptions) error {
	x, err := e.Embed(m, seqs)
	if err != nil {
		return fmt.Errorf("model: calibration: %w", err)
	}
	defer x.Free()
	steps := calibrationSteps(opt)
	for i := range m.Config.Layers {
		b, err := m.Block(i)
		if err != nil {
			return err
		}
		prefetch(m, i+1)
		if err := e.calibrateBlock(b, x, c, steps); err != nil {
			return fmt.Errorf("model: calibration of block %d: %w", i, err)
		}
		if opt.ReleaseBlocks {
			m.ReleaseBlock(i)
		}
	}
	return nil
}

// calibrateBlock observes and updates b's steps in turn, then runs b with its final weights
// to make the next block's inputs.
func (e *GPU) calibrateBlock(b *Block, x *DeviceBatch, c GPUCalibrator, steps [][]Group) error {
	g, err := e.uploadBlock(b)
	if err != nil {
		return err
	}
	for _, step := range steps {
		hook := stepHook(step, func(gr Group, p cuda.DevicePtr, rows, cols int) error {
			return c.ObserveGPU(b.Index, gr, p, rows, cols)
		})
		if err := e.observe(g, x, hook); err != nil {
			e.freeBlock(g)
			return err
		}
		err := c.Update(b, step)
		if err == nil {
			err = e.refreshLinears(g, step)
		}
		if err != nil {
			e.freeBlock(g)
			return err
		}
	}
	err = e.forwardBlock(g, x, nil)
	if ferr := e.freeBlock(g); err == nil {
		err = ferr
	}
	return err
}

// observe runs block g on a copy of each chunk of x, up to where hook stops it.
func (e *GPU) observe(g *gpuBlock, x *DeviceBatch, hook GPUHook) error {
	chunk := e.chunkSequences(x.S, x.T)
	rowBytes := 4 * x.T * e.cfg.Hidden
	for s := 0; s < x.S; s += chunk {
		n := min(chunk, x.S-s)
		tmp, err := e.work("observe.x", n*rowBytes)
		if err != nil {
			return err
		}
		if err := e.dev.CopyDeviceAsync(tmp, x.X.Add(s*rowBytes), n*rowBytes, e.stream); err != nil {
			return err
		}
		if err := e.forwardChunk(g, tmp, n, x.T, hook); err != nil && !errors.Is(err, errStopForward) {
			return err
		}
	}
	if err := e.Synchronize(); err != nil {
		return err
	}
	return e.sampleMemory()
}
