package model

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/shares"
	"github.com/qpack-dev/qpack/internal/timeline"
)

// Calibration on several GPUs is data-parallel: each engine (one per GPU) holds the hidden
// states of its share of the calibration sequences and every block's weights, runs the block's
// observing passes over its share and reports its inputs to the calibrator with its shard
// number (the calibrator sums the shards' statistics, e.g. Gram matrices, before it uses them).
// A step's Update runs once, when every engine has finished observing the step; then each
// engine uploads the replaced weights and goes on. The engines run in goroutines of their own;
// every block, step and kernel is the one-GPU calibration's.

// ShardedCalibrator is a GPUCalibrator whose inputs come from several engines.
type ShardedCalibrator interface {
	// ObserveShard is GPUCalibrator.ObserveGPU for the sequences of engine shard: x is on that
	// engine's device and queued work must go on its stream. Engines call it concurrently.
	ObserveShard(shard, block int, g Group, x cuda.DevicePtr, rows, cols int) error
	// Update is GPUCalibrator.Update, called once per step when every engine has observed it
	// (and finished its queued work); each engine uploads the replaced weights afterwards.
	Update(b *Block, groups []Group) error
}

// PassEnder is a ShardedCalibrator told when every engine has finished an observing pass of
// block b that another pass of the same step follows (in a block of experts, the pass of the
// gate/up inputs), before any engine begins the next.
type PassEnder interface {
	EndPass(b *Block) error
}

// CalibrateSharded is GPU.Calibrate with the sequences split across engines in contiguous
// shares (engine i gets the i-th; they differ in size by at most one sequence). There must
// be at least as many sequences as engines.
func CalibrateSharded(engines []*GPU, m *Model, seqs [][]int, c ShardedCalibrator, opt CalibrateOptions) error {
	if len(seqs) < len(engines) {
		return fmt.Errorf("model: calibration: %d sequences cannot be shared by %d GPUs", len(seqs), len(engines))
	}
	share := shares.Even(len(seqs), len(engines))
	xs := make([]*DeviceBatch, len(engines))
	defer func() {
		for _, x := range xs {
			if x != nil {
				x.Free()
			}
		}
	}()
	err := eachEngine(engines, func(i int, e *GPU) (err error) {
		defer timeline.Begin(e.dev.Info().Ordinal, "embed")()
		xs[i], err = e.Embed(m, seqs[share[i]:share[i+1]])
		return err
	})
	if err != nil {
		return fmt.Errorf("model: calibration: %w", err)
	}
	var ahead *blockUpload // the next block's weights on their way to the engines
	defer func() { ahead.discard(engines) }()
	for i := range m.Config.Layers {
		end := timeline.Begin(timeline.Host, "read block %d", i)
		b, err := m.Block(i)
		end()
		if err != nil {
			return err
		}
		m.Prefetch(i + 1)
		end = timeline.Begin(timeline.Host, "block %d on the GPUs", i)
		gs, err := ahead.take(engines, b)
		if gs == nil && err == nil {
			gs, err = uploadShards(engines, b)
		}
		end()
		if err != nil {
			freeShards(engines, gs)
			return fmt.Errorf("model: calibration of block %d: %w", i, err)
		}
		// The next block goes up while this one calibrates: from the first block's last update
		// on (its passes have set up the engines' buffers by then), from the start of later ones.
		next := func() { ahead = uploadAhead(engines, m, i+1) }
		if i > 0 {
			next()
			next = nil
		}
		reset := b.observing(opt.Experts)
		err = calibrateShards(engines, b, gs, xs, c, opt, next)
		reset()
		if err != nil {
			return fmt.Errorf("model: calibration of block %d: %w", i, err)
		}
		end = timeline.Begin(timeline.Host, "release block %d", i)
		opt.release(m, i)
		end()
	}
	return nil
}

// calibrateShards runs block b's calibration on every engine (gs: its weights there), the steps'
// updates shared; after each update the engines share the uploads of the replaced weights
// (spread). beforeLast, if not nil, runs when the last step's update begins. It frees gs.
func calibrateShards(engines []*GPU, b *Block, gs []*gpuBlock, xs []*DeviceBatch, c ShardedCalibrator, opt CalibrateOptions, beforeLast func()) error {
	defer func() {
		defer timeline.Begin(timeline.Host, "free block %d on the GPUs", b.Index)()
		freeShards(engines, gs)
	}()
	steps := calibrationSteps(b, opt)
	update, shared := c.Update, len(engines) > 1 && !opt.ObserveOnly
	if shared {
		update = func(b *Block, groups []Group) error {
			if err := c.Update(b, groups); err != nil {
				return err
			}
			return refreshShards(engines, gs, groups)
		}
	}
	if beforeLast != nil && !opt.ObserveOnly {
		last, inner := steps[len(steps)-1], update
		update = func(b *Block, groups []Group) error {
			if beforeLast != nil && slices.Equal(groups, last) {
				beforeLast()
				beforeLast = nil
			}
			return inner(b, groups)
		}
	}
	updates := newRendezvous(len(engines), update)
	passes := newRendezvous(len(engines), func(b *Block, _ []Group) error {
		if p, ok := c.(PassEnder); ok {
			return p.EndPass(b)
		}
		return nil
	})
	return eachEngine(engines, func(i int, e *GPU) error {
		calibrate := e.calibrateBlock
		if opt.ObserveOnly {
			calibrate = e.observeBlock
		}
		err := calibrate(gs[i], xs[i], shard{c, i, updates, passes, shared}, steps)
		if err != nil {
			updates.abandon()
			passes.abandon()
		}
		return err
	})
}

// uploadShards puts block b on every engine (spread).
func uploadShards(engines []*GPU, b *Block) ([]*gpuBlock, error) {
	gs := make([]*gpuBlock, len(engines))
	err := eachEngine(engines, func(i int, e *GPU) (err error) {
		gs[i], err = e.placeBlock(b)
		return err
	})
	if err == nil {
		err = spread(engines, gs, func(g *gpuBlock) []blockPart { return g.parts }, func(e *GPU) *time.Duration { return &e.times.Upload })
	}
	if err == nil {
		b.releaseRaw()
	}
	if err == nil {
		err = finishShards(engines, gs)
	}
	return gs, err
}

// finishShards is every engine's finishBlock of its copy of a block; a copy that fails is
// freed and set to nil.
func finishShards(engines []*GPU, gs []*gpuBlock) error {
	return eachEngine(engines, func(i int, e *GPU) error {
		err := e.finishBlock(gs[i])
		if err != nil {
			gs[i] = nil // freed
		}
		return err
	})
}

// freeShards frees the engines' copies of a block.
func freeShards(engines []*GPU, gs []*gpuBlock) {
	for i, g := range gs {
		if g != nil {
			engines[i].freeBlock(g)
		}
	}
}

// refreshShards is each engine's refreshWeights after an update of the groups (spread), or only
// the 16-bit rounding where the update changed every engine's copy itself (KeepDeviceWeights).
func refreshShards(engines []*GPU, gs []*gpuBlock, groups []Group) error {
	current := true
	for _, g := range gs {
		current = current && g.deviceCurrent
		g.deviceCurrent = false
	}
	if current {
		return eachEngine(engines, func(i int, e *GPU) error {
			return e.timed(&e.times.Refresh, func() error { return e.roundChanged(gs[i], groups) })
		})
	}
	changed := func(g *gpuBlock) []blockPart {
		var parts []blockPart
		g.changeable(groups, func(dst cuda.DevicePtr, v []float32, _ string) error {
			parts = append(parts, blockPart{at: dst, data: v})
			return nil
		})
		return parts
	}
	err := spread(engines, gs, changed, func(e *GPU) *time.Duration { return &e.times.Refresh })
	if err != nil {
		return err
	}
	return eachEngine(engines, func(i int, e *GPU) error {
		return e.timed(&e.times.Refresh, func() error { return e.roundChanged(gs[i], groups) })
	})
}

// spread copies the parts of a block's weights that parts lists to every engine: each uploads
// an equal share of their bytes from the host (share), then copies the others' shares from the
// engines that uploaded them, over NVLink or PCIe. The host's bytes cross the buses once in all,
// on every GPU's at once. The time goes to each engine's *phase.
func spread(engines []*GPU, gs []*gpuBlock, parts func(g *gpuBlock) []blockPart, phase func(e *GPU) *time.Duration) error {
	err := eachEngine(engines, func(i int, e *GPU) error {
		return e.timed(phase(e), func() error {
			if err := e.Synchronize(); err != nil { // the passes before are done with the old weights
				return err
			}
			return uploadShare(engines, gs, parts, i, e.stager, &e.rawArea, e.stream)
		})
	})
	if err != nil || len(engines) == 1 {
		return err
	}
	return eachEngine(engines, func(i int, e *GPU) error {
		return e.timed(phase(e), func() error {
			return copyShares(engines, gs, parts, i, e.stream, func(e *GPU) *rawArea { return &e.rawArea })
		})
	})
}

// uploadShare queues engine i's share of the parts' bytes from the host on stream, through st.
func uploadShare(engines []*GPU, gs []*gpuBlock, parts func(g *gpuBlock) []blockPart, i int, st *cuda.Stager, area *rawArea, stream cuda.Stream) error {
	if err := area.upload(engines[i].dev, st, stream, gs[i], share(parts(gs[i]), i, len(engines))); err != nil {
		return fmt.Errorf("model: block %d weights on the GPU: %w", gs[i].b.Index, err)
	}
	return nil
}

// copyShares queues on stream the copies of the other engines' shares (uploaded and finished)
// into engine i's copy: float32 values as they are, BF16 and F16 weights as their bytes, from
// the uploading engine's area (area) into engine i's, widened there.
func copyShares(engines []*GPU, gs []*gpuBlock, parts func(g *gpuBlock) []blockPart, i int, stream cuda.Stream, area func(e *GPU) *rawArea) error {
	for j, from := range engines {
		if j == i {
			continue
		}
		for _, p := range share(parts(gs[j]), j, len(engines)) {
			to := gs[i].mem.Add(int(p.at - gs[j].mem)) // the engines' layouts are the same
			var err error
			if p.widened() {
				src, dst := area(from), area(engines[i])
				if err = engines[i].dev.CopyFromPeerAsync(dst.at(p), from.dev, src.at(p), len(p.raw.data), stream); err == nil {
					err = dst.widen(engines[i].dev, stream, to, p)
				}
			} else {
				err = engines[i].dev.CopyFromPeerAsync(to, from.dev, p.at, 4*p.len(), stream)
			}
			if err != nil {
				return fmt.Errorf("model: block %d weights from GPU %d: %w", gs[i].b.Index, from.dev.Info().Ordinal, err)
			}
		}
	}
	return nil
}

// share is the i-th of n equal shares of the parts' values, cutting parts where a share ends.
func share(parts []blockPart, i, n int) []blockPart {
	total := 0
	for _, p := range parts {
		total += p.len()
	}
	lo, hi := total*i/n, total*(i+1)/n
	var out []blockPart
	at := 0
	for _, p := range parts {
		a, b := max(lo, at), min(hi, at+p.len())
		if a < b {
			out = append(out, p.slice(a-at, b-at))
		}
		at += p.len()
	}
	return out
}

// shard is one engine's view of a ShardedCalibrator; refreshed says that its updates also
// refresh every engine's weights (refreshShards). passes holds every engine at the end of an
// observing pass that another pass of the same step follows (endPass).
type shard struct {
	c         ShardedCalibrator
	index     int
	updates   *rendezvous
	passes    *rendezvous
	refreshed bool
}

func (s shard) ObserveGPU(block int, g Group, x cuda.DevicePtr, rows, cols int) error {
	return s.c.ObserveShard(s.index, block, g, x, rows, cols)
}

func (s shard) Update(b *Block, groups []Group) error { return s.updates.arrive(b, groups) }

// endPass returns once every engine has finished the observing pass of block b that c's engine
// has: a step of a block of experts observes the down inputs in a second pass, after every
// gate/up input, and the calibrator chooses how an expert's down input is observed from the
// tokens routed to it on all the GPUs (ExpertObservation.AllTokens).
func endPass(c GPUCalibrator, b *Block) error {
	if s, ok := c.(shard); ok {
		return s.passes.arrive(b, nil)
	}
	return nil
}

// refresh uploads what the step's Update changed in g, unless the update did (refreshShards) or
// changed g itself (KeepDeviceWeights).
func (e *GPU) refresh(g *gpuBlock, step []Group, c GPUCalibrator) error {
	current := g.deviceCurrent
	g.deviceCurrent = false
	if s, ok := c.(shard); ok && s.refreshed {
		return nil
	}
	if current {
		return e.timed(&e.times.Refresh, func() error { return e.roundChanged(g, step) })
	}
	return e.timed(&e.times.Refresh, func() error { return e.refreshWeights(g, step) })
}

// eachEngine runs f for every engine at once and returns the first error that is not
// errAbandoned (the other engines' answer when one fails).
func eachEngine(engines []*GPU, f func(i int, e *GPU) error) error {
	errs := make([]error, len(engines))
	var wg sync.WaitGroup
	for i, e := range engines {
		wg.Go(func() { errs[i] = f(i, e) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, errAbandoned) {
			return err
		}
	}
	return errors.Join(errs...)
}

// errAbandoned is what engines waiting at a step hear when another engine failed.
var errAbandoned = errors.New("another GPU's calibration failed")

// rendezvous runs update once for every n arrivals: the n-th caller runs it, the others wait
// for its result. After abandon, waiting and later callers get errAbandoned.
type rendezvous struct {
	n      int
	update func(b *Block, groups []Group) error

	mu      sync.Mutex
	arrived int
	round   *round
	gone    chan struct{} // closed by abandon
	once    sync.Once
}

type round struct {
	done chan struct{} // closed when err is set
	err  error
}

func newRendezvous(n int, update func(b *Block, groups []Group) error) *rendezvous {
	return &rendezvous{n: n, update: update, round: &round{done: make(chan struct{})}, gone: make(chan struct{})}
}

func (r *rendezvous) arrive(b *Block, groups []Group) error {
	r.mu.Lock()
	this := r.round
	r.arrived++
	last := r.arrived == r.n
	if last {
		r.arrived, r.round = 0, &round{done: make(chan struct{})}
	}
	r.mu.Unlock()
	if last {
		select {
		case <-r.gone:
			this.err = errAbandoned
		default:
			this.err = r.update(b, groups)
		}
		close(this.done)
		return this.err
	}
	select {
	case <-this.done:
		return this.err
	case <-r.gone:
		return errAbandoned
	}
}

func (r *rendezvous) abandon() { r.once.Do(func() { close(r.gone) }) }

// MaxSumShards is the most Gram matrices SumUpperShards adds at once.
const MaxSumShards = 8

// SumUpperShards queues, on the engine's stream, the sum of the upper triangles (row ≤ column)
// of columns [c0, c1) of the k×k column-major Gram matrices grams (one per GPU, in shard order,
// every one readable from this engine's GPU: peer access), added in that order and written into
// every one of them. Engines running it for disjoint column bands at once make every matrix's
// upper triangle the total; FinishGram then mirrors it.
func (e *GPU) SumUpperShards(grams []cuda.DevicePtr, k, c0, c1 int) error {
	if len(grams) < 1 || len(grams) > MaxSumShards || c0 < 0 || c1 > k || c0 > c1 {
		return fmt.Errorf("model: summing columns [%d, %d) of %d Gram matrices of %d columns", c0, c1, len(grams), k)
	}
	if c0 == c1 {
		return nil
	}
	var p [MaxSumShards]cuda.DevicePtr
	copy(p[:], grams)
	const threads, maxColumns = 256, 65535 // a grid's most blocks in y
	for c := c0; c < c1; c += maxColumns {
		end := min(c+maxColumns, c1)
		grid := cuda.Dim3{X: (end + threads - 1) / threads, Y: end - c, Z: 1} // rows 0…c of column c
		err := e.fn.sumUpperShards.Launch(grid, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, e.stream,
			p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], int32(len(grams)), int32(k), int32(c))
		if err != nil {
			return err
		}
	}
	return nil
}

// AddFloats adds the n float32 values at src to those at dst, on the engine's stream.
func (e *GPU) AddFloats(dst, src cuda.DevicePtr, n int) error {
	return e.elementwise(e.fn.add, n, dst, src, int64(n))
}
