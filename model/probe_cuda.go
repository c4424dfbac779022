package model

import (
	"fmt"

	"github.com/qpack-dev/qpack/cuda"
)

// LinearKL is LinearKL with the forward passes on the GPU: all slots live in one device
// allocation, so the reference and the streams that share a block's weights run as one batch.
func (e *GPU) LinearKL(m *Model, seqs [][]int, replace Replacement, memBytes int64, progress Progress) (map[string]float64, error) {
	if err := checkProbeSeqs(m, seqs); err != nil {
		return nil, err
	}
	if err := e.accepts(m); err != nil {
		return nil, err
	}
	return linearKL(m, &gpuProbe{e: e, m: m, seqs: seqs, slot: streamBytes(m, seqs)}, streamBytes(m, seqs), replace, memBytes, progress)
}

// gpuProbe is the probe engine of the GPU forward pass.
type gpuProbe struct {
	e     *GPU
	m     *Model
	seqs  [][]int
	slot  int64          // bytes per slot
	x     cuda.DevicePtr // every slot's hidden states
	block *gpuBlock
	lin   map[*Linear]*gpuLinear
}

func (p *gpuProbe) at(slot int) cuda.DevicePtr { return p.x.Add(int(int64(slot) * p.slot)) }

func (p *gpuProbe) alloc(n int) (err error) {
	if p.x, err = p.e.dev.Alloc(int(int64(n) * p.slot)); err != nil {
		return fmt.Errorf("model: probe: %d slots of %d×%d hidden states on the GPU: %w", n, len(p.seqs), len(p.seqs[0]), err)
	}
	return nil
}

func (p *gpuProbe) embed(slot int) error {
	x, err := p.e.Embed(p.m, p.seqs)
	if err != nil {
		return err
	}
	defer x.Free()
	if err := p.e.dev.CopyDeviceAsync(p.at(slot), x.X, int(p.slot), p.e.stream); err != nil {
		return err
	}
	return p.e.Synchronize() // x is freed next
}

func (p *gpuProbe) copy(dst, src int) error {
	return p.e.dev.CopyDeviceAsync(p.at(dst), p.at(src), int(p.slot), p.e.stream)
}

func (p *gpuProbe) enter(b *Block) (err error) {
	if p.block, err = p.e.uploadBlock(b); err != nil {
		return err
	}
	p.lin = p.block.lin
	return nil
}

func (p *gpuProbe) leave() error {
	g := p.block
	p.block, p.lin = nil, nil
	return p.e.freeBlock(g)
}

func (p *gpuProbe) forward(from, to int) error {
	S := len(p.seqs)
	x := &DeviceBatch{X: p.at(from), S: (to - from) * S, T: len(p.seqs[0]), e: p.e}
	return p.e.forwardBlock(p.block, x, nil)
}

// swap keeps a device copy of l's weights and uploads w in their place, after the work
// queued with the weights there now.
func (p *gpuProbe) swap(l *Linear, w []float32) error {
	if err := p.e.Synchronize(); err != nil { // before a larger buffer replaces one in use
		return err
	}
	dst := p.lin[l].w
	saved, err := p.e.buffer("probe.saved", 4*len(w))
	if err != nil {
		return err
	}
	if err := p.e.dev.CopyDeviceAsync(saved, dst, 4*len(w), p.e.stream); err != nil {
		return err
	}
	return p.e.stager.CopyToDevice(dst, cuda.Bytes(w), p.e.stream)
}

// restore puts back the weights swap saved.
func (p *gpuProbe) restore(l *Linear) error {
	saved, err := p.e.buffer("probe.saved", 4*len(l.W))
	if err != nil {
		return err
	}
	return p.e.dev.CopyDeviceAsync(p.lin[l].w, saved, 4*len(l.W), p.e.stream)
}

func (p *gpuProbe) meanKL(ref, slot int) (float64, error) {
	var st tokenStats
	if err := p.e.compareStates(p.m, p.m, p.at(ref), p.at(slot), p.seqs, &st); err != nil {
		return 0, err
	}
	return st.comparison(len(p.seqs), len(p.seqs[0])).MeanKL, nil
}

func (p *gpuProbe) close() error {
	if p.block != nil {
		p.e.freeBlock(p.block)
	}
	if p.x == 0 {
		return nil
	}
	if err := p.e.Synchronize(); err != nil {
		return err
	}
	return p.e.dev.Free(p.x)
}
