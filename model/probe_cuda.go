package model

import (
	"errors"
	"fmt"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/timeline"
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

// LinearKLSharded is LinearKL on several GPUs (engines, one each): the probes' streams are dealt
// to the GPUs in turn, each GPU runs the reference stream beside its own, and every block goes up
// to every GPU once per sweep. memBytes bounds each GPU's hidden states.
func LinearKLSharded(engines []*GPU, m *Model, seqs [][]int, replace Replacement, memBytes int64, progress Progress) (map[string]float64, error) {
	if len(engines) == 1 {
		return engines[0].LinearKL(m, seqs, replace, memBytes, progress)
	}
	if err := checkProbeSeqs(m, seqs); err != nil {
		return nil, err
	}
	sp := &shardedProbe{engines: engines, uploads: &probeUploads{engines: engines, m: m}}
	n, slot := int64(len(engines)), streamBytes(m, seqs)
	for _, e := range engines {
		if err := e.accepts(m); err != nil {
			return nil, err
		}
		sp.parts = append(sp.parts, &gpuProbe{e: e, m: m, seqs: seqs, slot: slot})
	}
	return linearKL(m, sp, slot, replace, n*memBytes-2*(n-1)*slot, progress) // the reference and last slot on each GPU
}

// shardedProbe is the probe engine of several GPUs: slot 0 (the reference) and the last slot
// (the next sweep's start) are on every GPU, and stream s (1 ≤ s ≤ streams) on GPU (s−1) mod n,
// the GPU's local slot (s−1)/n + 1: the streams begun before a block are a prefix of every GPU's
// local slots. Each GPU's work is queued on its own stream, so a probe on one GPU runs while the
// next is prepared on another.
type shardedProbe struct {
	engines []*GPU
	parts   []*gpuProbe // parts[i] runs on engines[i]
	streams int         // slots between the reference and the last
	uploads *probeUploads
}

// local returns the GPU holding stream slot and the slot's number there.
func (s *shardedProbe) local(slot int) (*gpuProbe, int, error) {
	if slot < 1 || slot > s.streams {
		return nil, 0, fmt.Errorf("model: probe: slot %d is no stream of 1–%d", slot, s.streams)
	}
	n := len(s.parts)
	return s.parts[(slot-1)%n], (slot-1)/n + 1, nil
}

func (s *shardedProbe) lanes() int { return len(s.parts) }

func (s *shardedProbe) laneOf(slot int) int { return (slot - 1) % len(s.parts) }

// localCount is how many of slots [0, to) (the reference and streams) GPU i holds.
func (s *shardedProbe) localCount(i, to int) int {
	if to-2 < i { // stream i+1, its first, is not below to
		return 1
	}
	return 2 + (to-2-i)/len(s.parts) // streams i+1, i+1+n, … below to
}

// lastLocal is the local number of the last slot (the next sweep's start) on each GPU.
func (s *shardedProbe) lastLocal() int { return (s.streams+len(s.parts)-1)/len(s.parts) + 1 }

// each runs f for every GPU at once.
func (s *shardedProbe) each(f func(i int, p *gpuProbe) error) error {
	return eachEngine(s.engines, func(i int, _ *GPU) error { return f(i, s.parts[i]) })
}

func (s *shardedProbe) alloc(n int) error {
	s.streams = n - 2
	return s.each(func(_ int, p *gpuProbe) error { return p.alloc(s.lastLocal() + 1) })
}

func (s *shardedProbe) embed(slot int) error {
	if slot != 0 {
		return fmt.Errorf("model: probe: embedding into slot %d", slot)
	}
	return s.each(func(_ int, p *gpuProbe) error { return p.embed(0) })
}

// copy copies the reference into a stream (on its GPU), or between the reference and the last
// slot (on every GPU).
func (s *shardedProbe) copy(dst, src int) error {
	last := s.streams + 1
	switch {
	case dst == last && src == 0:
		return s.each(func(_ int, p *gpuProbe) error { return p.copy(s.lastLocal(), 0) })
	case dst == 0 && src == last:
		return s.each(func(_ int, p *gpuProbe) error { return p.copy(0, s.lastLocal()) })
	case src == 0:
		p, l, err := s.local(dst)
		if err != nil {
			return err
		}
		return p.copy(l, 0)
	}
	return fmt.Errorf("model: probe: copying slot %d into slot %d", src, dst)
}

// enter puts b on every GPU, each uploading a share of its bytes from the host and copying the
// others' from the GPUs that uploaded them (probeUploads).
func (s *shardedProbe) enter(b *Block) error {
	gs, err := s.uploads.enter(b)
	if err != nil {
		return err
	}
	for i, p := range s.parts {
		p.block, p.lin = gs[i], gs[i].lin
	}
	return nil
}

// probeUploads puts the probe's blocks on its GPUs, each block's weights going up while the
// block before it runs (uploadAhead: each engine's second stream and pinned buffer). Uploaded
// when it was entered, a block waited for the passes through the block before it, and they for
// its upload: on two H200s a 7B's block took 60–120 ms to enter.
type probeUploads struct {
	engines []*GPU
	m       *Model
	ahead   *blockUpload // the next block's upload, begun when the block before it was entered
}

// enter returns the engines' copies of b, uploaded ahead or now, and begins the next block's
// upload.
func (u *probeUploads) enter(b *Block) ([]*gpuBlock, error) {
	defer timeline.Begin(timeline.Host, "probe: block %d up", b.Index)()
	gs, err := u.ahead.take(u.engines, b)
	u.ahead = nil
	if err == nil && gs == nil {
		gs, err = uploadShards(u.engines, b)
	}
	if err != nil {
		freeShards(u.engines, gs)
		return nil, err
	}
	u.ahead = uploadAhead(u.engines, u.m, b.Index+1)
	return gs, nil
}

// discard waits for an upload ahead and frees what it placed.
func (u *probeUploads) discard() {
	u.ahead.discard(u.engines)
	u.ahead = nil
}

func (s *shardedProbe) leave() error {
	return s.each(func(_ int, p *gpuProbe) error { return p.leave() })
}

// forward runs the entered block over slots [from, to): one stream on its GPU, or the reference
// and the streams before to on every GPU.
func (s *shardedProbe) forward(from, to int) error {
	if from == 0 {
		return s.each(func(i int, p *gpuProbe) error { return p.forward(0, s.localCount(i, to)) })
	}
	p, l, err := s.local(from)
	if err != nil || to != from+1 {
		return errors.Join(err, fmt.Errorf("model: probe: running slots %d to %d", from, to))
	}
	return p.forward(l, l+1)
}

func (s *shardedProbe) swap(slot int, l *Linear, w []float32) error {
	p, local, err := s.local(slot)
	if err != nil {
		return err
	}
	return p.swap(local, l, w)
}

func (s *shardedProbe) restore(slot int, l *Linear) error {
	p, local, err := s.local(slot)
	if err != nil {
		return err
	}
	return p.restore(local, l)
}

func (s *shardedProbe) meanKL(ref, slot int) (float64, error) {
	p, l, err := s.local(slot)
	if err != nil || ref != 0 {
		return 0, errors.Join(err, fmt.Errorf("model: probe: comparing slot %d with slot %d", slot, ref))
	}
	return p.meanKL(0, l)
}

func (s *shardedProbe) close() error {
	s.uploads.discard()
	return s.each(func(_ int, p *gpuProbe) error { return p.close() })
}

// gpuProbe is the probe engine of the GPU forward pass.
type gpuProbe struct {
	e       *GPU
	m       *Model
	seqs    [][]int
	slot    int64          // bytes per slot
	x       cuda.DevicePtr // every slot's hidden states
	block   *gpuBlock
	lin     map[*Linear]*gpuLinear
	uploads *probeUploads // alone on its GPU (not a part of a shardedProbe)
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

func (p *gpuProbe) enter(b *Block) error {
	if p.uploads == nil {
		p.uploads = &probeUploads{engines: []*GPU{p.e}, m: p.m}
	}
	gs, err := p.uploads.enter(b)
	if err != nil {
		return err
	}
	p.block, p.lin = gs[0], gs[0].lin
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
// queued with the weights there now, and rounds them to the 16 bits the GEMMs read, if they do.
func (p *gpuProbe) swap(_ int, l *Linear, w []float32) error {
	lane := p.e.dev.Info().Ordinal
	endWait := timeline.Begin(lane, "probe: passes queued")
	if err := p.e.Synchronize(); err != nil { // before a larger buffer replaces one in use
		return err
	}
	endWait()
	defer timeline.Begin(lane, "probe: swap %s", l.Name)()
	d := p.lin[l]
	saved, err := p.e.buffer("probe.saved", 4*len(w))
	if err != nil {
		return err
	}
	if err := p.e.dev.CopyDeviceAsync(saved, d.w, 4*len(w), p.e.stream); err != nil {
		return err
	}
	if err := p.e.stager.CopyToDevice(d.w, cuda.Bytes(w), p.e.stream); err != nil {
		return err
	}
	return p.round(d)
}

// restore puts back the weights swap saved (and their 16-bit copy, rounded again: the same bits).
func (p *gpuProbe) restore(_ int, l *Linear) error {
	saved, err := p.e.buffer("probe.saved", 4*len(l.W))
	if err != nil {
		return err
	}
	d := p.lin[l]
	if err := p.e.dev.CopyDeviceAsync(d.w, saved, 4*len(l.W), p.e.stream); err != nil {
		return err
	}
	return p.round(d)
}

// round makes d's 16-bit copy from its float32 weights, where the engine's GEMMs read one
// (GPUOptions.F16, BF16): without it, a swapped weight would not reach the forward pass.
func (p *gpuProbe) round(d *gpuLinear) error {
	if d.wb == 0 {
		return nil
	}
	return p.e.roundLinear(d)
}

func (p *gpuProbe) meanKL(ref, slot int) (float64, error) {
	var st tokenStats
	if err := p.e.compareStates(p.m, p.m, p.at(ref), p.at(slot), p.seqs, &st); err != nil {
		return 0, err
	}
	return st.comparison(len(p.seqs), len(p.seqs[0])).MeanKL, nil
}

func (p *gpuProbe) close() error {
	if p.uploads != nil {
		p.uploads.discard()
	}
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
