package model

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/timeline"
)

// GPUCalibrator is a Calibrator whose statistics are gathered on the GPU.
type GPUCalibrator interface {
	// ObserveGPU receives the input x [rows, cols] (device memory, row-major) of group g of
	// block `block` for a chunk of calibration sequences (rows = sequences × length). Work
	// queued on the engine's stream (GPU.Stream, GPU.AddGram) reads x before it is reused.
	ObserveGPU(block int, g Group, x cuda.DevicePtr, rows, cols int) error
	// Update is Calibrator.Update: it may replace the groups' weights through Linear.SetWeight;
	// the engine uploads the block again afterwards, unless the Update changed the engine's
	// copy itself (GPU.KeepDeviceWeights).
	Update(b *Block, groups []Group) error
}

// Calibrate is model.Calibrate with the forward passes on the GPU: the hidden states of every
// calibration sequence and one block's weights are resident there; the host reads the next
// block while the GPU works on this one. (CalibrateSharded with this one engine.)
func (e *GPU) Calibrate(m *Model, seqs [][]int, c GPUCalibrator, opt CalibrateOptions) error {
	return CalibrateSharded([]*GPU{e}, m, seqs, oneShard{c}, opt)
}

// oneShard is a GPUCalibrator as the ShardedCalibrator of a single engine.
type oneShard struct{ c GPUCalibrator }

func (o oneShard) ObserveShard(_, block int, g Group, x cuda.DevicePtr, rows, cols int) error {
	return o.c.ObserveGPU(block, g, x, rows, cols)
}

func (o oneShard) Update(b *Block, groups []Group) error { return o.c.Update(b, groups) }

// CalibrationTimes splits a calibration's wall time by phase, each phase ending when the GPU
// has finished its work: what tells where a GPU calibration's time goes.
type CalibrationTimes struct {
	Upload  time.Duration // block weights to the GPU (uploadBlock)
	Observe time.Duration // the observing passes: forward GEMMs, attention, Gram matrices
	Update  time.Duration // the calibrator's Update: GPTQ's solves, AWQ's searches
	Refresh time.Duration // replaced weights to the GPU again
	Output  time.Duration // each block's output with its final weights
}

// CalibrationTimes returns the time spent so far in each phase of Calibrate.
func (e *GPU) CalibrationTimes() CalibrationTimes { return e.times }

// timed runs f, waits for the GPU and adds the wall time to *d (one of e.times' phases), a
// span of the --trace timeline.
func (e *GPU) timed(d *time.Duration, f func() error) error {
	if timeline.On() {
		defer timeline.Begin(e.dev.Info().Ordinal, "%s%s", e.phaseName(d), e.blockName())()
	}
	start := time.Now()
	err := f()
	if err == nil {
		err = e.Synchronize()
	}
	*d += time.Since(start)
	return err
}

// phaseName names the phase of CalibrationTimes that d points to.
func (e *GPU) phaseName(d *time.Duration) string {
	switch d {
	case &e.times.Upload:
		return "weights up"
	case &e.times.Observe:
		return "observe"
	case &e.times.Update:
		return "update"
	case &e.times.Refresh:
		return "replaced weights up"
	case &e.times.Output:
		return "block output"
	}
	return "?"
}

// blockName is " (block i)" for the block being calibrated, or "".
func (e *GPU) blockName() string {
	if e.current == nil {
		return ""
	}
	return fmt.Sprintf(" (block %d)", e.current.b.Index)
}

// calibrateBlock observes and updates the steps of block g (uploaded) in turn, then runs it
// with its final weights to make the next block's inputs (but for the last block).
func (e *GPU) calibrateBlock(g *gpuBlock, x *DeviceBatch, c GPUCalibrator, steps [][]Group) error {
	b := g.b
	e.current = g
	defer func() { e.current = nil }()
	st, err := e.stagedState(b, x, steps)
	if err != nil {
		return err
	}
	lead := steps // the steps before the staged ones, or all of them
	if st != nil {
		lead = steps[:len(steps)-len(denseStages)]
	}
	var keep *mlpState
	for i, step := range lead {
		if i == len(steps)-1 && slices.Equal(step, []Group{GroupDown}) {
			if keep, err = e.mlpState(x); err != nil {
				return err
			}
		}
		if err := e.timed(&e.times.Observe, func() error { return e.observeStep(g, x, c, step, keep) }); err != nil {
			return err
		}
		if err := e.timed(&e.times.Update, func() error { return c.Update(b, step) }); err != nil {
			return err
		}
		if err := e.refresh(g, step, c); err != nil {
			return err
		}
	}
	if st != nil {
		return e.calibrateStaged(g, x, c, st)
	}
	if e.lastBlock(g) {
		return nil
	}
	return e.timed(&e.times.Output, func() error {
		if keep != nil {
			return e.finishFromMLPState(g, x, keep)
		}
		return e.forwardBlock(g, x, nil)
	})
}

// lastBlock says that g is the model's last block: its output with the final weights, the
// input of no block, is not computed (the calibration ends with the block's last update).
func (e *GPU) lastBlock(g *gpuBlock) bool { return g.b.Index == e.cfg.Layers-1 }

// observeStep runs block g on copies of x, handing c the inputs of the step's groups (in two
// passes for some steps of a block of experts, observationPasses); keep applies to the last.
func (e *GPU) observeStep(g *gpuBlock, x *DeviceBatch, c GPUCalibrator, step []Group, keep *mlpState) error {
	passes := observationPasses(g.b, step)
	for i, pass := range passes {
		hook := stepHook(pass, func(gr Group, p cuda.DevicePtr, rows, cols int) error {
			return c.ObserveGPU(g.b.Index, gr, p, rows, cols)
		})
		k := keep
		if i < len(passes)-1 {
			k = nil
		}
		if err := e.observe(g, x, hook, k); err != nil {
			return err
		}
		if i < len(passes)-1 {
			if err := endPass(c, g.b); err != nil {
				return err
			}
		}
	}
	return nil
}

// observeBlock is ObserveOnly's single pass: b runs over x in place, each group's input handed
// to c, then c.Update sees every group (in a block of experts, a pass on copies for the
// gate/up inputs first, observationPasses).
func (e *GPU) observeBlock(g *gpuBlock, x *DeviceBatch, c GPUCalibrator, _ [][]Group) error {
	b := g.b
	passes := observationPasses(b, b.Groups())
	for _, early := range passes[:len(passes)-1] {
		if err := e.observeStep(g, x, c, early, nil); err != nil {
			return err
		}
		if err := endPass(c, b); err != nil {
			return err
		}
	}
	last := passes[len(passes)-1]
	hook := func(gr Group, p cuda.DevicePtr, rows, cols int) error {
		if !slices.Contains(last, gr) {
			return nil
		}
		return c.ObserveGPU(b.Index, gr, p, rows, cols)
	}
	end := timeline.Begin(e.dev.Info().Ordinal, "observing pass (block %d)", b.Index)
	err := e.forwardBlock(g, x, hook)
	if err == nil {
		err = e.Synchronize()
	}
	end()
	if err != nil {
		return err
	}
	e.current = g // Update may read the weights where they are (LinearWeights)
	defer func() { e.current = nil }()
	return c.Update(b, b.Groups())
}

// LinearWeights returns where the block being calibrated holds l's weights on the GPU (row-major
// float32 [Out, In]), for a calibrator's Update to read before it replaces them; ok is false
// outside an Update or for a linear of another block.
func (e *GPU) LinearWeights(l *Linear) (w cuda.DevicePtr, ok bool) {
	g := e.current
	if g == nil {
		return 0, false
	}
	for _, d := range g.lin {
		if d.name == l.Name && d.out == l.Out && d.in == l.In {
			return d.w, true
		}
	}
	return 0, false
}

// mlpState keeps what the observing pass of a last step of down_proj alone computed, for every
// sequence: the residual stream after attention (mid [S, T, Hidden]) and down_proj's input
// (act [S·T, Intermediate]). Every other weight is final by then, so the block's output is
// mid + down(act): the final pass needs that one GEMM instead of the whole block again.
type mlpState struct{ mid, act cuda.DevicePtr }

// mlpState returns buffers for x's mlpState, or nil when they would not leave 4 GiB and the
// calibrator's reserve of the GPU free (the final pass then runs the whole block).
func (e *GPU) mlpState(x *DeviceBatch) (*mlpState, error) {
	rows := x.S * x.T
	midBytes, actBytes := 4*rows*e.cfg.Hidden, 4*rows*e.cfg.Intermediate
	if e.scratch["keep.act"].size < actBytes {
		free, _, err := e.dev.MemoryInfo()
		if err != nil {
			return nil, err
		}
		if free < uint64(midBytes+actBytes)+4<<30+e.reserve {
			return nil, nil
		}
	}
	mid, err := e.buffer("keep.mid", midBytes)
	if err != nil {
		return nil, err
	}
	act, err := e.buffer("keep.act", actBytes)
	if err != nil {
		return nil, err
	}
	return &mlpState{mid, act}, nil
}

// observe runs block g on a copy of each chunk of x, up to where hook stops it; with keep it
// also keeps each chunk's mlpState (the copy of x is made in keep.mid).
func (e *GPU) observe(g *gpuBlock, x *DeviceBatch, hook GPUHook, keep *mlpState) error {
	chunk := e.chunkSequences(x.S, x.T)
	rowBytes, actRowBytes := 4*x.T*e.cfg.Hidden, 4*x.T*e.cfg.Intermediate
	for s := 0; s < x.S; s += chunk {
		n := min(chunk, x.S-s)
		tmp, h := cuda.DevicePtr(0), hook
		if keep == nil {
			var err error
			if tmp, err = e.work("observe.x", n*rowBytes); err != nil {
				return err
			}
		} else {
			tmp = keep.mid.Add(s * rowBytes)
			h = func(gr Group, p cuda.DevicePtr, rows, cols int) error {
				if gr == GroupDown {
					if err := e.dev.CopyDeviceAsync(keep.act.Add(s*actRowBytes), p, n*actRowBytes, e.stream); err != nil {
						return err
					}
				}
				return hook(gr, p, rows, cols)
			}
		}
		if err := e.dev.CopyDeviceAsync(tmp, x.X.Add(s*rowBytes), n*rowBytes, e.stream); err != nil {
			return err
		}
		if err := e.forwardChunk(g, tmp, n, x.T, h); err != nil && !errors.Is(err, errStopForward) {
			return err
		}
	}
	if err := e.Synchronize(); err != nil {
		return err
	}
	return e.sampleMemory()
}

// finishFromMLPState sets x = mid + down(act), the block's output with its final weights.
func (e *GPU) finishFromMLPState(g *gpuBlock, x *DeviceBatch, keep *mlpState) error {
	chunk := e.chunkSequences(x.S, x.T)
	rowBytes, actRowBytes := 4*x.T*e.cfg.Hidden, 4*x.T*e.cfg.Intermediate
	if err := e.dev.CopyDeviceAsync(x.X, keep.mid, x.S*rowBytes, e.stream); err != nil {
		return err
	}
	for s := 0; s < x.S; s += chunk {
		n := min(chunk, x.S-s)
		rows := n * x.T
		out, err := e.floats("out", rows*e.cfg.Hidden)
		if err != nil {
			return err
		}
		if err := e.linear(out, keep.act.Add(s*actRowBytes), g.down, rows); err != nil {
			return err
		}
		if err := e.elementwise(e.fn.add, rows*e.cfg.Hidden, x.X.Add(s*rowBytes), out, int64(rows*e.cfg.Hidden)); err != nil {
			return err
		}
	}
	if err := e.Synchronize(); err != nil {
		return err
	}
	return e.sampleMemory()
}
