package model

import (
	"errors"
	"slices"

	"github.com/qpack-dev/qpack/cuda"
)

// A dense block's true-sequential calibration observes four steps — q/k/v, o, gate/up, down —
// each after the earlier steps' linears were replaced. Run from the block's input each time,
// the q/k/v GEMMs and the attention run three times and o twice. But what a step computes
// before its own input depends only on weights that are final by then, so three buffers kept
// over the steps make every GEMM run once per block: the o step keeps the residual stream
// (mid) and o's input (attn); the gate/up step adds o's output to mid; the down step keeps
// down's input (act), and the block's output is mid + down(act). The kernels and their inputs
// are those of the recomputing passes, so the statistics are the same bit for bit.

// stagedState holds those buffers for every calibration sequence.
type stagedState struct {
	mid  cuda.DevicePtr // [S·T, Hidden]: the block input, then the residual after attention
	attn cuda.DevicePtr // [S·T, Heads·HeadDim]: o's input
	act  cuda.DevicePtr // [S·T, Intermediate]: down's input
}

// denseStages are the steps stagedState serves: Block.Stages of a dense block.
var denseStages = [][]Group{{GroupQKV}, {GroupO}, {GroupGateUp}, {GroupDown}}

// stagedState returns the buffers for calibrating b over x in steps that end with denseStages
// (AWQ+GPTQ's first step, every group at once, runs before them as usual), or nil where staging
// does not apply (a block of experts, other steps, or too little GPU memory: under 4 GiB and the
// calibrator's reserve would be left free; the recomputing passes then run).
func (e *GPU) stagedState(b *Block, x *DeviceBatch, steps [][]Group) (*stagedState, error) {
	n := len(denseStages)
	if e.noStaging || b.MoE != nil || len(steps) < n || !slices.EqualFunc(steps[len(steps)-n:], denseStages, slices.Equal) {
		return nil, nil
	}
	rows, c := x.S*x.T, e.cfg
	sizes := map[string]int{"keep.mid": 4 * rows * c.Hidden, "keep.attn": 4 * rows * c.Heads * c.HeadDim, "keep.act": 4 * rows * c.Intermediate}
	need := 0
	for name, bytes := range sizes {
		if e.scratch[name].size < bytes {
			need += bytes
		}
	}
	if need > 0 {
		free, _, err := e.dev.MemoryInfo()
		if err != nil {
			return nil, err
		}
		if free < uint64(need)+4<<30+e.reserve {
			return nil, nil
		}
	}
	var st stagedState
	for _, p := range []struct {
		dst  *cuda.DevicePtr
		name string
	}{{&st.mid, "keep.mid"}, {&st.attn, "keep.attn"}, {&st.act, "keep.act"}} {
		var err error
		if *p.dst, err = e.buffer(p.name, sizes[p.name]); err != nil {
			return nil, err
		}
	}
	return &st, nil
}

// calibrateStaged is calibrateBlock's loop over denseStages with st's buffers: each step's
// pass, then c.Update and the replaced weights uploaded, then the block's output into x.
func (e *GPU) calibrateStaged(g *gpuBlock, x *DeviceBatch, c GPUCalibrator, st *stagedState) error {
	passes := []func(g *gpuBlock, x *DeviceBatch, st *stagedState, s, n int, observe GPUHook) error{
		e.stageQKV, e.stageO, e.stageGateUp, e.stageDown,
	}
	observe := func(gr Group, p cuda.DevicePtr, rows, cols int) error {
		return c.ObserveGPU(g.b.Index, gr, p, rows, cols)
	}
	chunk := e.chunkSequences(x.S, x.T)
	for i, step := range denseStages {
		err := e.timed(&e.times.Observe, func() error {
			for s := 0; s < x.S; s += chunk {
				if err := passes[i](g, x, st, s, min(chunk, x.S-s), observe); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := e.sampleMemory(); err != nil {
			return err
		}
		if err := e.timed(&e.times.Update, func() error { return c.Update(g.b, step) }); err != nil {
			return err
		}
		if err := e.refresh(g, step, c); err != nil {
			return err
		}
	}
	if e.lastBlock(g) {
		return nil
	}
	return e.timed(&e.times.Output, func() error { return e.finishFromMLPState(g, x, &mlpState{mid: st.mid, act: st.act}) })
}

// stageQKV observes the normed input of sequences [s, s+n).
func (e *GPU) stageQKV(g *gpuBlock, x *DeviceBatch, _ *stagedState, s, n int, observe GPUHook) error {
	rows := n * x.T
	h, err := e.floats("h", rows*e.cfg.Hidden)
	if err != nil {
		return err
	}
	if err := e.rmsNorm(h, x.X.Add(s*4*x.T*e.cfg.Hidden), g.inNorm, rows, e.cfg.Hidden); err != nil {
		return err
	}
	return observe(GroupQKV, h, rows, e.cfg.Hidden)
}

// stageO copies the input into mid, runs the attention (q/k/v final) and keeps and observes
// o's input.
func (e *GPU) stageO(g *gpuBlock, x *DeviceBatch, st *stagedState, s, n int, observe GPUHook) error {
	c, rows := e.cfg, n*x.T
	mid, attn := st.mid.Add(s*4*x.T*c.Hidden), st.attn.Add(s*4*x.T*c.Heads*c.HeadDim)
	if err := e.dev.CopyDeviceAsync(mid, x.X.Add(s*4*x.T*c.Hidden), 4*rows*c.Hidden, e.stream); err != nil {
		return err
	}
	h, err := e.floats("h", rows*c.Hidden)
	if err != nil {
		return err
	}
	if err := e.rmsNorm(h, mid, g.inNorm, rows, c.Hidden); err != nil {
		return err
	}
	keep := func(gr Group, a cuda.DevicePtr, rows, cols int) error {
		if gr != GroupO {
			return nil
		}
		if err := e.dev.CopyDeviceAsync(attn, a, 4*rows*cols, e.stream); err != nil {
			return err
		}
		if err := observe(GroupO, attn, rows, cols); err != nil {
			return err
		}
		return errStopForward
	}
	if err := e.attention(0, h, g, n, x.T, keep); !errors.Is(err, errStopForward) {
		return err
	}
	return nil
}

// stageGateUp adds o's output (o final) to mid and observes its post-attention norm.
func (e *GPU) stageGateUp(g *gpuBlock, x *DeviceBatch, st *stagedState, s, n int, observe GPUHook) error {
	c, rows := e.cfg, n*x.T
	mid, attn := st.mid.Add(s*4*x.T*c.Hidden), st.attn.Add(s*4*x.T*c.Heads*c.HeadDim)
	out, err := e.floats("out", rows*c.Hidden)
	if err != nil {
		return err
	}
	if err := e.linear(out, attn, g.o, rows); err != nil {
		return err
	}
	if err := e.elementwise(e.fn.add, rows*c.Hidden, mid, out, int64(rows*c.Hidden)); err != nil {
		return err
	}
	h, err := e.floats("h", rows*c.Hidden)
	if err != nil {
		return err
	}
	if err := e.rmsNorm(h, mid, g.postNorm, rows, c.Hidden); err != nil {
		return err
	}
	return observe(GroupGateUp, h, rows, c.Hidden)
}

// stageDown computes silu(gate(h))·up(h) (gate and up final) into act and observes it.
func (e *GPU) stageDown(g *gpuBlock, x *DeviceBatch, st *stagedState, s, n int, observe GPUHook) error {
	c, rows := e.cfg, n*x.T
	mid, act := st.mid.Add(s*4*x.T*c.Hidden), st.act.Add(s*4*x.T*c.Intermediate)
	h, err := e.floats("h", rows*c.Hidden)
	if err != nil {
		return err
	}
	if err := e.rmsNorm(h, mid, g.postNorm, rows, c.Hidden); err != nil {
		return err
	}
	up, err := e.floats("up", rows*c.Intermediate)
	if err != nil {
		return err
	}
	if err := e.gateUp(act, up, h, g.gate, g.up, rows); err != nil {
		return err
	}
	if err := e.elementwise(e.fn.siluMul, rows*c.Intermediate, act, up, int64(rows*c.Intermediate)); err != nil {
		return err
	}
	return observe(GroupDown, act, rows, c.Intermediate)
}
