package model

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/qpack-dev/qpack/internal/timeline"
)

// Replacement gives the weight [Out, In] that stands in for l while l is probed (for example
// l's weight quantized and dequantized), or nil to leave l out. It is called for the linears of
// a block at once, from several goroutines.
type Replacement func(l *Linear) ([]float32, error)

// LinearKL measures, for each decoder linear that replace gives a weight for, the mean
// KL(p‖q) over the predicted tokens of seqs (all of one length), where p is the model's
// next-token distribution and q the one with that linear's weight alone replaced.
//
// It tells how much a linear's weight error costs the model's output: by the linearity of
// the KL in small, independent layer errors (HIGGS: the loss rise ≈ Σ_l α_l·relative error_l),
// KL divided by the replacement's relative error is the linear's coefficient α_l, which varies
// by two orders of magnitude between the linears of one model.
//
// memBytes bounds the hidden states kept at once (at least one block's probes are kept);
// progress, when set, is told the probes done after each block.
func LinearKL(m *Model, seqs [][]int, replace Replacement, memBytes int64, progress Progress) (map[string]float64, error) {
	if err := checkProbeSeqs(m, seqs); err != nil {
		return nil, err
	}
	return linearKL(m, &cpuProbe{m: m, seqs: seqs}, streamBytes(m, seqs), replace, memBytes, progress)
}

// probeEngine holds numbered slots of hidden states of the probe sequences and runs blocks on
// them, on the CPU or the GPU.
type probeEngine interface {
	alloc(slots int) error
	embed(slot int) error
	copy(dst, src int) error
	enter(b *Block) error // make b the block that forward runs
	leave() error
	forward(from, to int) error                  // the entered block over slots [from, to)
	swap(slot int, l *Linear, w []float32) error // l of the entered block computes with w for slot until restore
	restore(slot int, l *Linear) error
	meanKL(ref, slot int) (float64, error)
	close() error
}

// linearKL is the probe over any engine. Slot 0 is the reference stream, the last slot keeps
// the reference's input to the first block of the next sweep, and the slots between are
// perturbed streams. Block j runs once on the reference and on every stream begun at an
// earlier block (all of which have j's own weights), after running, on a copy of the
// reference's input, once per linear of j with that linear's replacement swapped in. So a
// probe costs (Layers − j) block passes over the probe tokens, and each block is entered once
// per sweep; when the streams do not all fit in memBytes, sweeps of consecutive blocks take
// their turns, each going on from where the reference stood. The next probeAhead blocks are read
// and their replacements made in the background while the engine runs this one.
func linearKL(m *Model, eng probeEngine, slotBytes int64, replace Replacement, memBytes int64, progress Progress) (kl map[string]float64, err error) {
	defer func() {
		if cerr := eng.close(); err == nil {
			err = cerr
		}
	}()
	perBlock := m.Config.maxBlockLinears()
	L := m.Config.Layers
	streams := int(min(int64(m.Config.allLinears()), max(int64(perBlock), memBytes/slotBytes-2)))
	resume := streams + 1
	if err := eng.alloc(streams + 2); err != nil {
		return nil, err
	}
	if err := eng.embed(0); err != nil {
		return nil, err
	}
	kl = map[string]float64{}
	resident := m.residentBlocks()
	for first, done := 0, 0; first < L; {
		var names []string                                          // names[i] is slot i+1's linear
		next := L                                                   // the first block this sweep does not probe
		ahead := []<-chan prepared{prepareBlock(m, first, replace)} // blocks j, j+1, … being read and replaced
		for j := first; j < L; j++ {
			var p prepared
			endWait := timeline.Begin(timeline.Host, "probe: block %d read", j)
			if len(ahead) > 0 {
				if p = <-ahead[0]; p.err != nil {
					return nil, p.err
				}
				ahead = ahead[1:]
			} else if p.block, err = m.Block(j); err != nil {
				return nil, err
			}
			endWait()
			endBlock := timeline.Begin(timeline.Host, "probe: block %d (%d streams before, %d begun)", j, len(names), p.probes())
			older := len(names) + 1 // the reference and the streams begun before block j
			after := older - 1 + p.probes()
			// The sweep's chain of prepared blocks goes on while their probes are sure to fit.
			for next := j + 1 + len(ahead); p.linears != nil && next < L && len(ahead) < probeAhead &&
				after+(len(ahead)+1)*perBlock <= streams; next++ {
				ahead = append(ahead, prepareBlock(m, next, replace))
			}
			if len(ahead) == 0 {
				m.Prefetch(j + 1)
			}
			if err := eng.enter(p.block); err != nil {
				return nil, err
			}
			if p.linears == nil && next == L {
				next = j
				if err := eng.copy(resume, 0); err != nil {
					return nil, err
				}
			}
			if names, err = probeBlock(eng, p, names); err != nil {
				return nil, err
			}
			if err := eng.forward(0, older); err != nil {
				return nil, fmt.Errorf("model: probe: block %d: %w", j, err)
			}
			if err := eng.leave(); err != nil {
				return nil, err
			}
			endBlock()
			if !resident[j] {
				m.RecycleBlock(j) // the engines keep none of its slices (swap's weights are the replacements)
			}
			if p.linears != nil {
				progress.report(done+len(names), m.Config.linears())
			}
		}
		for i, name := range names {
			if kl[name], err = eng.meanKL(0, i+1); err != nil {
				return nil, err
			}
		}
		done += len(names)
		first = next
		if first < L {
			if err := eng.copy(0, resume); err != nil {
				return nil, err
			}
		}
	}
	return kl, nil
}

// probeAhead is how many blocks the probe reads and replaces ahead of the one it runs: a probed
// block's replacements (seven quantizations and their errors on the host) took 0.3 s for a 7B
// block, three times a block's passes on a GPU, and held every GPU while they were made.
const probeAhead = 3

// prepared is a block read for probing with the replacements of its linears (linears and
// weights in Block.AllLinears order; linears non-nil when the block is probed).
type prepared struct {
	block   *Block
	linears []*Linear
	weights [][]float32 // nil where replace left the linear out
	err     error
}

func (p prepared) probes() (n int) {
	for _, w := range p.weights {
		if w != nil {
			n++
		}
	}
	return n
}

// prepareBlock reads block j and makes its replacements on another goroutine.
func prepareBlock(m *Model, j int, replace Replacement) <-chan prepared {
	ch := make(chan prepared, 1)
	go func() {
		defer timeline.Begin(timeline.Host, "probe: read and replace block %d", j)()
		b, err := m.Block(j)
		if err != nil {
			ch <- prepared{err: err}
			return
		}
		// The linears at once: each replacement (a quantization, its error) takes one core.
		p := prepared{block: b, linears: b.AllLinears()}
		p.weights = make([][]float32, len(p.linears))
		errs := make([]error, len(p.linears))
		var wg sync.WaitGroup
		for i, l := range p.linears {
			wg.Go(func() {
				w, err := replace(l)
				if err == nil && w != nil && len(w) != l.Out*l.In {
					err = fmt.Errorf("model: probe: %s: replacement has %d values, want %d×%d", l.Name, len(w), l.Out, l.In)
				}
				p.weights[i], errs[i] = w, err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			ch <- prepared{err: err}
			return
		}
		ch <- p
	}()
	return ch
}

// probeBlock begins a stream for each replaced linear of p: a copy of the reference's input
// run through p's block with that linear's replacement swapped in. Where the engine puts streams
// on several GPUs (lanes), each GPU's probes run one after another and the GPUs' at once: a
// probe's swap copies its weights through the host and waits for the GPU's passes before it.
func probeBlock(eng probeEngine, p prepared, names []string) ([]string, error) {
	type probe struct {
		slot int
		l    *Linear
		w    []float32
	}
	laneOf, lanes := func(int) int { return 0 }, 1
	if ln, ok := eng.(lanedProbe); ok {
		laneOf, lanes = ln.laneOf, ln.lanes()
	}
	queues := make([][]probe, lanes)
	var begun []string
	for i, l := range p.linears {
		if p.weights[i] == nil {
			continue
		}
		slot := len(names) + len(begun) + 1
		queues[laneOf(slot)] = append(queues[laneOf(slot)], probe{slot, l, p.weights[i]})
		begun = append(begun, l.Name)
	}
	errs := make([]error, lanes)
	var running sync.WaitGroup
	for lane, queue := range queues {
		running.Go(func() {
			for _, pr := range queue {
				if err := runProbe(eng, pr.slot, pr.l, pr.w); err != nil {
					errs[lane] = fmt.Errorf("model: probe of %s: %w", pr.l.Name, err)
					return
				}
			}
		})
	}
	running.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return append(names, begun...), nil
}

// lanedProbe is a probe engine whose streams run on several lanes (GPUs) that take calls at once.
type lanedProbe interface {
	lanes() int
	laneOf(slot int) int // the lane that runs stream slot
}

// runProbe runs the entered block over stream slot, begun from the reference, with l computing
// with w.
func runProbe(eng probeEngine, slot int, l *Linear, w []float32) error {
	if err := eng.copy(slot, 0); err != nil {
		return err
	}
	if err := eng.swap(slot, l, w); err != nil {
		return err
	}
	err := eng.forward(slot, slot+1)
	if rerr := eng.restore(slot, l); err == nil {
		err = rerr
	}
	return err
}

func checkProbeSeqs(m *Model, seqs [][]int) error {
	if len(seqs) == 0 || len(seqs[0]) < 2 {
		return fmt.Errorf("model: probe needs sequences of at least 2 tokens")
	}
	for i, s := range seqs {
		if len(s) != len(seqs[0]) {
			return fmt.Errorf("model: probe: sequence %d has %d tokens, sequence 0 has %d (all must be equally long)", i, len(s), len(seqs[0]))
		}
	}
	return nil
}

// streamBytes is the size of one slot: the hidden states of all probe sequences.
func streamBytes(m *Model, seqs [][]int) int64 {
	return 4 * int64(len(seqs)) * int64(len(seqs[0])) * int64(m.Config.Hidden)
}

// cpuProbe is the probe engine of the CPU forward pass.
type cpuProbe struct {
	m      *Model
	seqs   [][]int
	slots  [][][]float32 // slot → sequence → hidden states [T, Hidden]
	block  *Block
	orig   []float32   // the swapped linear's own weight
	refLog [][]float32 // the reference's logits per sequence, computed once
}

func (c *cpuProbe) alloc(n int) error {
	T, H := len(c.seqs[0]), c.m.Config.Hidden
	c.slots = make([][][]float32, n)
	for i := range c.slots {
		c.slots[i] = make([][]float32, len(c.seqs))
		for s := range c.seqs {
			c.slots[i][s] = make([]float32, T*H)
		}
	}
	return nil
}

func (c *cpuProbe) embed(slot int) error {
	for s, seq := range c.seqs {
		x, err := c.m.Embedding(seq)
		if err != nil {
			return err
		}
		copy(c.slots[slot][s], x)
	}
	return nil
}

func (c *cpuProbe) copy(dst, src int) error {
	for s := range c.seqs {
		copy(c.slots[dst][s], c.slots[src][s])
	}
	return nil
}

func (c *cpuProbe) enter(b *Block) error { c.block = b; return nil }
func (c *cpuProbe) leave() error         { c.block = nil; return nil }
func (c *cpuProbe) close() error         { c.slots = nil; return nil }

func (c *cpuProbe) forward(from, to int) error {
	for _, slot := range c.slots[from:to] {
		for _, x := range slot {
			if err := c.block.Forward(x, len(c.seqs[0]), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// swap sets W directly: a probe's replacement need not be checked like SetWeight's, and the
// original comes back the same way.
func (c *cpuProbe) swap(_ int, l *Linear, w []float32) error { c.orig, l.W = l.W, w; return nil }
func (c *cpuProbe) restore(_ int, l *Linear) error           { l.W = c.orig; return nil }

func (c *cpuProbe) meanKL(ref, slot int) (float64, error) {
	T := len(c.seqs[0])
	if c.refLog == nil {
		for _, x := range c.slots[ref] {
			c.refLog = append(c.refLog, c.m.Head(x, T))
		}
	}
	var st tokenStats
	for s, seq := range c.seqs {
		st.compareLogits(c.refLog[s], c.m.Head(c.slots[slot][s], T), seq, c.m.Config.Vocab)
	}
	kl := st.comparison(len(c.seqs), T).MeanKL
	if math.IsNaN(kl) || math.IsInf(kl, 0) {
		return 0, fmt.Errorf("model: probe: KL divergence is %v", kl)
	}
	return kl, nil
}
