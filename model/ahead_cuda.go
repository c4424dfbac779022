package model

import (
	"errors"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/timeline"
)

// Weights uploaded ahead: while the engines calibrate block i, a goroutine puts block i+1's
// weights on every engine (each its share from the host, then the others' shares from their
// GPUs, as spread does) through a second stream and pinned buffer of each engine. The host's
// copy into pinned memory was most of a block's upload, and the GPUs waited for it between
// blocks. It starts at the first block's last update (its passes have set up the engines'
// buffers by then; the calibrator's reserve stands for the solvers') and with each later block,
// and runs only where the GPU has room for the block besides that reserve and 4 GiB; otherwise, or if it fails, the block is uploaded when it begins, as before. Either way
// the copy is finished (finishBlock) on the engine's stream when the block begins.

// blockUpload is one block's weights on their way to the engines.
type blockUpload struct {
	index int
	done  chan struct{} // closed when gs is set
	gs    []*gpuBlock   // nil where the upload did not run or failed
}

// aheadCopier is an engine's stream and pinned buffer for uploads ahead, made on first use.
type aheadCopier struct {
	stream  cuda.Stream
	stager  *cuda.Stager
	rawArea *rawArea
}

// uploadAhead starts putting block i of m on every engine; nil past the last block.
func uploadAhead(engines []*GPU, m *Model, i int) *blockUpload {
	if i >= m.Config.Layers {
		return nil
	}
	u := &blockUpload{index: i, done: make(chan struct{})}
	go func() {
		defer close(u.done)
		if b, err := m.Block(i); err == nil { // an error comes back again when the block is used
			u.gs = uploadAll(engines, b)
		}
	}()
	return u
}

// errNoRoom is the answer of an engine whose GPU lacks the room for a block uploaded ahead.
var errNoRoom = errors.New("no room for a block ahead")

// uploadAll puts b on every engine through their copiers, or returns nil (what it placed freed).
func uploadAll(engines []*GPU, b *Block) []*gpuBlock {
	gs := make([]*gpuBlock, len(engines))
	all := func(g *gpuBlock) []blockPart { return g.parts }
	err := eachEngine(engines, func(i int, e *GPU) (err error) {
		defer timeline.Begin(e.dev.Info().Ordinal, "weights up ahead (block %d)", b.Index)()
		if err := e.roomFor(blockBytes(b)); err != nil {
			return err
		}
		c, err := e.copier()
		if err != nil {
			return err
		}
		if gs[i], err = e.placeBlock(b); err != nil {
			return err
		}
		if err := uploadShare(engines, gs, all, i, c.stager, c.rawArea, c.stream); err != nil {
			return err
		}
		return e.dev.SynchronizeStream(c.stream)
	})
	if err == nil && len(engines) > 1 {
		err = eachEngine(engines, func(i int, e *GPU) error {
			defer timeline.Begin(e.dev.Info().Ordinal, "weights ahead from the other GPUs (block %d)", b.Index)()
			if err := copyShares(engines, gs, all, i, e.ahead.stream, func(e *GPU) *rawArea { return e.ahead.rawArea }); err != nil {
				return err
			}
			return e.dev.SynchronizeStream(e.ahead.stream)
		})
	}
	if err == nil {
		b.releaseRaw()
	}
	if err != nil {
		for _, e := range engines { // copies still queued there must land before the buffers are reused
			if e.ahead.stager != nil {
				e.dev.SynchronizeStream(e.ahead.stream)
			}
		}
		freeShards(engines, gs)
		return nil
	}
	return gs
}

// take waits for the upload and returns the engines' copies of b, finished (finishShards), or
// nil where the upload did not run (the caller uploads b itself). u may be nil.
func (u *blockUpload) take(engines []*GPU, b *Block) ([]*gpuBlock, error) {
	if u == nil {
		return nil, nil
	}
	<-u.done
	gs := u.gs
	u.gs = nil
	if gs == nil || u.index != b.Index {
		freeShards(engines, gs)
		return nil, nil
	}
	for _, e := range engines {
		e.blocksAhead++
	}
	defer timeline.Begin(timeline.Host, "finish block %d on the GPUs", b.Index)()
	return gs, finishShards(engines, gs)
}

// discard waits for the upload and frees what it placed. u may be nil.
func (u *blockUpload) discard(engines []*GPU) {
	if u == nil {
		return
	}
	<-u.done
	freeShards(engines, u.gs)
	u.gs = nil
}

// blockBytes is the GPU memory that placeBlock takes for b, about, and the rawArea its BF16 and
// F16 weights are staged in.
func blockBytes(b *Block) uint64 {
	var n uint64
	for _, l := range b.AllLinears() {
		n += 4 * uint64(l.Out*l.In+len(l.Bias))
		if l.raw.widened() {
			n += uint64(len(l.raw.data))
		}
	}
	return n
}

// roomFor says whether the GPU has bytes free besides the calibrator's reserve and 4 GiB.
func (e *GPU) roomFor(bytes uint64) error {
	free, _, err := e.dev.MemoryInfo()
	if err != nil {
		return err
	}
	if free+e.spareBytes() < bytes+e.reserve+4<<30 { // spares of an earlier block, reused
		return errNoRoom
	}
	return nil
}

// copier returns the engine's stream and pinned buffer for uploads ahead, made on first use.
func (e *GPU) copier() (aheadCopier, error) {
	if e.ahead.stager != nil {
		return e.ahead, nil
	}
	stream, err := e.dev.NewStream()
	if err != nil {
		return aheadCopier{}, err
	}
	stager, err := e.dev.NewStager(cuda.DefaultStagingBytes)
	if err != nil {
		e.dev.DestroyStream(stream)
		return aheadCopier{}, err
	}
	e.ahead = aheadCopier{stream, stager, &rawArea{}}
	return e.ahead, nil
}

// PrepareUploadsAhead makes the stream and pinned buffer that uploads ahead use, which are
// otherwise made when the second block begins: pinning host memory on several GPUs at once
// held that block's solves by a tenth of a second on four GPUs. Calibrations of more than two
// blocks call it while setting up.
func (e *GPU) PrepareUploadsAhead() error {
	_, err := e.copier()
	return err
}

// closeCopier frees the engine's copier, if it made one.
func (e *GPU) closeCopier() {
	if e.ahead.stager != nil {
		e.ahead.rawArea.free(e.dev)
		e.ahead.stager.Close()
		e.dev.DestroyStream(e.ahead.stream)
		e.ahead = aheadCopier{}
	}
}
