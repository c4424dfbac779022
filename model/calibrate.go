package model

import (
	"errors"
	"fmt"
	"slices"
)

// Calibrator is driven by Calibrate: it sees the input of every linear group of every block over
// the calibration sequences — to accumulate GPTQ's Hessian XᵀX or AWQ's mean |x|, say — and may
// replace each block's linear weights before that block's outputs are passed on.
type Calibrator interface {
	// Observe receives the input x [rows, cols] (row-major) of group g of block `block` for one
	// calibration sequence: rows is the sequence length, cols the In of the group's linears.
	// x is a buffer of the forward pass, reused once Observe returns: accumulate, don't keep it.
	Observe(block int, g Group, x []float32, rows, cols int) error
	// Update is called once every sequence's inputs of groups have been observed, before anything
	// that depends on those groups' outputs is computed. It may replace their weights through
	// Linear.SetWeight (dequantized quantized weights, say), and may run b.Attention / b.MLP.
	Update(b *Block, groups []Group) error
}

// CalibrateOptions tunes Calibrate.
type CalibrateOptions struct {
	// TrueSequential updates the groups of a block one at a time in forward order (qkv, o,
	// gate_up, down), each observed with the earlier groups already replaced, as GPTQ's
	// --true-sequential does. Otherwise all four groups are observed with the block's weights
	// as loaded and updated by one Update call.
	TrueSequential bool
	// ReleaseBlocks drops each block's weights once the next block's inputs are computed, so
	// only one block is resident at a time; m is then not the updated model afterwards.
	ReleaseBlocks bool
	// RecycleBlocks, with ReleaseBlocks, gives each released block's memory to the later blocks'
	// reads (Model.RecycleBlock): for a calibrator that keeps none of a block's slices past its
	// last Update.
	RecycleBlocks bool
	// ObserveOnly runs each block once: its groups are observed during the pass that makes the
	// next block's inputs, and Update is called once per block with every group afterwards.
	// Weights that Update replaces therefore never reach a later block's inputs: for a
	// calibrator that only gathers statistics, or AWQ, which (as AutoAWQ) feeds every block the
	// unquantized model's activations. TrueSequential and Steps do not apply.
	ObserveOnly bool
	// Experts says how the groups of experts are observed (mixture-of-experts blocks).
	Experts ExpertObservation
	// Steps, when set, lists the groups of block b observed and updated together, in order,
	// instead of TrueSequential's choice; a group may appear in several steps (AWQ scales a
	// block with all its groups observed, then GPTQ quantizes it group by group: awq+gptq).
	Steps func(b *Block) [][]Group
}

// release drops block i of m after its calibration, as opt asks.
func (opt CalibrateOptions) release(m *Model, i int) {
	switch {
	case opt.ReleaseBlocks && opt.RecycleBlocks:
		m.RecycleBlock(i)
	case opt.ReleaseBlocks:
		m.ReleaseBlock(i)
	}
}

// Calibrate runs m block by block over the calibration sequences, the sequential pipeline of
// GPTQ (reference llama.py): only the current block's input hidden states of all sequences are
// resident. For each block it
//
//  1. runs the block on every sequence, handing the inputs of the groups of the current step to
//     c.Observe (the pass stops after the last group the step needs; in a mixture-of-experts
//     block each expert's groups see the tokens routed to it, none for an expert no token
//     chose);
//  2. calls c.Update(block, step groups), which may replace their weights;
//  3. after the last step, runs the block with its final (e.g. quantized) weights to make the
//     next block's inputs, so quantization error propagates as it will at inference.
//
// Replaced weights stay in m: afterwards m is the updated model (Perplexity(m, ...) evaluates it),
// unless opt.ReleaseBlocks dropped each block after use to bound memory.
func Calibrate(m *Model, seqs [][]int, c Calibrator, opt CalibrateOptions) error {
	hidden := make([][]float32, len(seqs))
	for s, seq := range seqs {
		x, err := m.Embedding(seq)
		if err != nil {
			return fmt.Errorf("model: calibration sequence %d: %w", s, err)
		}
		hidden[s] = x
	}
	for i := range m.Config.Layers {
		b, err := m.Block(i)
		if err != nil {
			return err
		}
		reset := b.observing(opt.Experts)
		err = calibrateBlock(b, seqs, hidden, c, opt)
		reset()
		if err != nil {
			return err
		}
		opt.release(m, i)
	}
	return nil
}

// calibrateBlock observes and updates block b's steps, then runs it with its final weights
// over hidden in place, making the next block's inputs. Each sequence's attention output is
// kept once q/k/v are final (Block.forward): the later steps and the last pass start from it,
// so true-sequential calibration computes the attention once per block after the q/k/v step.
func calibrateBlock(b *Block, seqs [][]int, hidden [][]float32, c Calibrator, opt CalibrateOptions) error {
	if opt.ObserveOnly {
		return observeBlock(b, seqs, hidden, c)
	}
	attn := make([][]float32, len(seqs))
	run := func(s int, x []float32, hook Hook) error { return b.forward(x, len(seqs[s]), hook, &attn[s]) }
	for _, step := range calibrationSteps(b, opt) {
		if err := observeStep(b, seqs, hidden, c, step, run); err != nil {
			return err
		}
		if err := c.Update(b, step); err != nil {
			return fmt.Errorf("model: calibration update of block %d: %w", b.Index, err)
		}
		if slices.Contains(step, GroupQKV) { // the update may have changed q/k/v or the norm
			clear(attn)
		}
	}
	for s := range seqs {
		if err := run(s, hidden[s], nil); err != nil {
			return err
		}
	}
	return nil
}

// observeBlock runs block b over every sequence in place, reporting the input of each group to
// c, then calls c.Update with every group: ObserveOnly's single pass (in a block of experts,
// a pass on copies for the gate/up inputs first, observationPasses).
func observeBlock(b *Block, seqs [][]int, hidden [][]float32, c Calibrator) error {
	passes := observationPasses(b, b.Groups())
	for _, early := range passes[:len(passes)-1] {
		if err := observeStep(b, seqs, hidden, c, early, func(s int, x []float32, hook Hook) error { return b.Forward(x, len(seqs[s]), hook) }); err != nil {
			return err
		}
	}
	last := passes[len(passes)-1]
	hook := func(g Group, x []float32, rows, cols int) error {
		if !slices.Contains(last, g) {
			return nil
		}
		if err := c.Observe(b.Index, g, x, rows, cols); err != nil {
			return fmt.Errorf("model: calibration of block %d, %s: %w", b.Index, g, err)
		}
		return nil
	}
	for s, seq := range seqs {
		if err := b.Forward(hidden[s], len(seq), hook); err != nil {
			return err
		}
	}
	if err := c.Update(b, b.Groups()); err != nil {
		return fmt.Errorf("model: calibration update of block %d: %w", b.Index, err)
	}
	return nil
}

// calibrationSteps lists the groups of b observed and updated together, in order.
func calibrationSteps(b *Block, opt CalibrateOptions) [][]Group {
	if opt.Steps != nil {
		return opt.Steps(b)
	}
	if opt.TrueSequential {
		return b.Stages()
	}
	return [][]Group{b.Groups()}
}

// stepHook wraps observe so that it sees only the inputs of the step's groups, and stops the
// forward pass after the last of them.
func stepHook[X any](step []Group, observe func(g Group, x X, rows, cols int) error) func(g Group, x X, rows, cols int) error {
	last := step[len(step)-1]
	return func(g Group, x X, rows, cols int) error {
		if slices.Contains(step, g) {
			if err := observe(g, x, rows, cols); err != nil {
				return err
			}
		}
		if g == last {
			return errStopForward
		}
		return nil
	}
}

// observeStep runs block b (or the half of it that run runs) on a copy of every sequence's
// hidden states, reporting the inputs of the step's groups to c and stopping after the last of
// them (two such passes for some steps of a block of experts, observationPasses).
func observeStep(b *Block, seqs [][]int, hidden [][]float32, c Calibrator, step []Group, run func(s int, x []float32, hook Hook) error) error {
	var scratch []float32
	for _, pass := range observationPasses(b, step) {
		hook := stepHook(pass, func(g Group, x []float32, rows, cols int) error {
			if err := c.Observe(b.Index, g, x, rows, cols); err != nil {
				return fmt.Errorf("model: calibration of block %d, %s: %w", b.Index, g, err)
			}
			return nil
		})
		for s := range seqs {
			scratch = append(scratch[:0], hidden[s]...)
			if err := run(s, scratch, hook); err != nil && !errors.Is(err, errStopForward) {
				return err
			}
		}
	}
	return nil
}

// observationPasses splits a step of a block of experts that observes gate/up and down inputs
// into two passes, the down inputs after every gate/up input, so that a calibrator has
// counted each expert's tokens when it chooses how its down input is observed
// (ExpertObservation.AllTokens). The second pass observes the experts' gate/up inputs again
// where the calibrator asks (ExpertObservation.GateUpAgain).
func observationPasses(b *Block, step []Group) [][]Group {
	if b.MoE == nil {
		return [][]Group{step}
	}
	var early, again, down []Group
	for _, g := range step {
		_, expert := g.Expert()
		switch {
		case g.Stage() == GroupDown.Stage():
			down = append(down, g)
		case expert:
			again = append(again, g)
			fallthrough
		default:
			early = append(early, g)
		}
	}
	if len(early) == 0 || len(down) == 0 {
		return [][]Group{step}
	}
	if b.MoE.observe.gateUpAgain() {
		down = append(again, down...)
	}
	return [][]Group{early, down}
}
