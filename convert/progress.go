package convert

import (
	"context"
	"sync"

	"github.com/qpack-dev/qpack/alloc"
)

// ProgressFunc receives how many of the output's tensors are written and the input bytes they
// came from (Convert, from the writers' goroutines, one call at a time), or how many tensors'
// sensitivities are measured (Plan; the total counts the linears, bytes are 0).
type ProgressFunc func(done, total int, bytes, totalBytes int64)

// tracked wraps each unit so that it does not start once opt.Context is cancelled, and so that
// its completion is reported to opt.Progress. bytes[i] is unit i's input size.
func tracked(units []unit, bytes []int64, opt Options) []unit {
	ctx := opt.context()
	var total int64
	for _, b := range bytes {
		total += b
	}
	var mu sync.Mutex
	done, doneBytes := 0, int64(0)
	out := make([]unit, len(units))
	for i, u := range units {
		out[i] = func(w tensorSink) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := u(w); err != nil {
				return err
			}
			if opt.Progress != nil {
				mu.Lock()
				done++
				doneBytes += bytes[i]
				opt.Progress(done, len(units), doneBytes, total)
				mu.Unlock()
			}
			return nil
		}
	}
	return out
}

// context is opt.Context, or one that is never cancelled.
func (o Options) context() context.Context {
	if o.Context == nil {
		return context.Background()
	}
	return o.Context
}

// countLinears counts the linear weights: the tensors a plan measures, unless embeddings or
// lm_head are candidates too.
func countLinears(descs []alloc.TensorDesc) int {
	n := 0
	for _, d := range descs {
		if d.Role.IsLinear() {
			n++
		}
	}
	return n
}
