package convert

import (
	"cmp"
	"io"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/qpack-dev/qpack/model"
)

// tensorSink takes the output's tensors by name, each whole, in any order and from several
// goroutines: a safetensors checkpoint writer, or a GGUF file's (ggufSink).
type tensorSink interface {
	Write(name string, data []byte) error
}

// unit is one step of writing the output: copying a kept tensor, or quantizing, packing and
// writing one module. Each writes its tensors at their places in the output files, which the
// header fixed before any data, so units finish in any order.
type unit func(out tensorSink) error

// runUnits runs units in order, at most workers at once, so that at most that many modules'
// inputs and results are in memory while reading, quantizing and writing overlap. It returns
// the error of the first failed unit, after which no unit starts.
func runUnits(out tensorSink, units []unit, workers int) error {
	var next atomic.Int64
	var failed atomic.Bool
	errs := make([]error, len(units))
	var wg sync.WaitGroup
	for range max(1, min(workers, len(units))) {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(units) {
					return
				}
				if errs[i] = units[i](out); errs[i] != nil {
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// interleaveShards reorders units so that the shards advance together: each unit's place is
// the fraction of its shard's bytes written before it, and units are taken by that fraction
// (ties in shard order; within a shard the order is kept). Buffered writes to one file take
// the file's lock, so writers working in different shards write in parallel where writers in
// one shard would queue.
func interleaveShards(units []unit, shard []int, bytes []int64) []unit {
	total := map[int]int64{}
	for i, s := range shard {
		total[s] += bytes[i]
	}
	place := make([]float64, len(units))
	done := map[int]int64{}
	for i, s := range shard {
		if total[s] > 0 {
			place[i] = float64(done[s]) / float64(total[s])
		}
		done[s] += bytes[i]
	}
	order := make([]int, len(units))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		i, j := order[a], order[b]
		if place[i] != place[j] {
			return place[i] < place[j]
		}
		return shard[i] < shard[j]
	})
	out := make([]unit, len(units))
	for k, i := range order {
		out[k] = units[i]
	}
	return out
}

// writeTimer adds up the time units spend writing, over all of them.
type writeTimer struct{ nanos atomic.Int64 }

// write writes one output tensor and counts the time.
func (w *writeTimer) write(out tensorSink, name string, data []byte) error {
	start := time.Now()
	err := out.Write(name, data)
	w.nanos.Add(int64(time.Since(start)))
	return err
}

func (w *writeTimer) seconds() float64 { return time.Duration(w.nanos.Load()).Seconds() }

// lockedWriter serializes writes to w, so that lines logged from several goroutines stay whole.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// calibrationOrder puts the units of a calibrating run in the order its results come: block by
// block, and in a block the kept tensors first, then the linears as the calibration's steps
// solve them (q, k, v, o, gate, up, down); the embedding first, the other tensors outside the
// blocks last. In the checkpoint's order a block's MLP comes before its attention: the
// writers took down_proj's unit first, the block's last result, and stood waiting for it while
// the attention's results were there to pack (on two GPUs a budget conversion's writing ended
// two seconds after its calibration).
func calibrationOrder(units []unit, names []string) []unit {
	type place struct{ block, rank int }
	at := make([]place, len(units))
	for i, name := range names {
		t := model.ParseTensorName(name)
		switch {
		case t.Block >= 0 && t.Role.IsLinear():
			at[i] = place{t.Block, int(t.Role)}
		case t.Block >= 0:
			at[i] = place{t.Block, -1}
		case t.Role == model.RoleEmbedding:
			at[i] = place{-1, 0}
		default:
			at[i] = place{math.MaxInt, 0}
		}
	}
	order := make([]int, len(units))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(at[a].block, at[b].block), cmp.Compare(at[a].rank, at[b].rank))
	})
	sorted := make([]unit, len(units))
	for i, o := range order {
		sorted[i] = units[o]
	}
	return sorted
}
