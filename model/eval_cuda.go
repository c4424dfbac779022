package model

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/cuda"
)

// batchBytes bounds the hidden states one GPU evaluation pass keeps on the device; more
// sequences are evaluated in several passes.
const batchBytes = 4 << 30

// headRows is how many rows of logits the head computes at once: at most 1 GiB of logits.
func (e *GPU) headRows(rows int) int {
	return max(1, min(rows, (1<<30)/(4*e.cfg.Vocab)))
}

// head computes the logits [rows, Vocab] of the hidden states at x (rows consecutive rows)
// into the named buffer.
func (e *GPU) head(m *Model, x cuda.DevicePtr, rows int, name string) (cuda.DevicePtr, error) {
	c := e.cfg
	norm, err := e.weights(m, m.Norm)
	if err != nil {
		return 0, err
	}
	w, err := e.weights(m, m.LMHead.W)
	if err != nil {
		return 0, err
	}
	h, err := e.floats("head.h", rows*c.Hidden)
	if err != nil {
		return 0, err
	}
	logits, err := e.floats(name, rows*c.Vocab)
	if err != nil {
		return 0, err
	}
	if err := e.rmsNorm(h, x, norm, rows, c.Hidden); err != nil {
		return 0, err
	}
	l := &gpuLinear{name: "lm_head", out: c.Vocab, in: c.Hidden, w: w}
	return logits, e.linear(logits, h, l, rows)
}

// run embeds seqs and runs m over them.
func (e *GPU) run(m *Model, seqs [][]int) (*DeviceBatch, error) {
	x, err := e.Embed(m, seqs)
	if err != nil {
		return nil, err
	}
	if err := e.Run(m, x); err != nil {
		x.Free()
		return nil, err
	}
	return x, nil
}

// Logits is Model.Logits on the GPU.
func (e *GPU) Logits(m *Model, ids []int) ([]float32, error) {
	x, err := e.run(m, [][]int{ids})
	if err != nil {
		return nil, err
	}
	defer x.Free()
	out := make([]float32, len(ids)*e.cfg.Vocab)
	for r := 0; r < len(ids); r += e.headRows(len(ids)) {
		n := min(e.headRows(len(ids)), len(ids)-r)
		logits, err := e.head(m, x.X.Add(4*r*e.cfg.Hidden), n, "logits")
		if err != nil {
			return nil, err
		}
		if err := e.Synchronize(); err != nil {
			return nil, err
		}
		if err := e.dev.CopyFromDevice(cuda.Bytes(out[r*e.cfg.Vocab:(r+n)*e.cfg.Vocab]), logits); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Perplexity is Perplexity with the forward pass on the GPU: logits, log-softmax and the
// negative log-likelihoods are computed there; per-token values are summed on the host.
func (e *GPU) Perplexity(m *Model, ids []int, seqLen, maxSeqs int) (Result, error) {
	return e.PerplexityProgress(m, ids, seqLen, maxSeqs, nil)
}

// PerplexityProgress is Perplexity telling progress after each pass (a batch of sequences).
func (e *GPU) PerplexityProgress(m *Model, ids []int, seqLen, maxSeqs int, progress Progress) (Result, error) {
	seqs, err := Sequences(ids, seqLen, maxSeqs)
	if err != nil {
		return Result{}, err
	}
	var nll float64
	done := 0
	for _, part := range e.passes(seqs) {
		x, err := e.run(m, part)
		if err != nil {
			return Result{}, err
		}
		err = e.perToken(part, 1, func(row, n int, out, targets cuda.DevicePtr) error {
			logits, err := e.head(m, x.X.Add(4*row*e.cfg.Hidden), n, "logits")
			if err != nil {
				return err
			}
			return e.rowwise(e.fn.tokenNLL, n, logits, targets, out, int32(e.cfg.Vocab))
		}, func(v []float64) {
			nll += v[0]
		})
		x.Free()
		if err != nil {
			return Result{}, err
		}
		done += len(part)
		progress.report(done, len(seqs))
	}
	return newResult(nll, len(seqs), seqLen), nil
}

// Compare is Compare with both models run on the GPU.
func (e *GPU) Compare(ref, test *Model, ids []int, seqLen, maxSeqs int) (Comparison, error) {
	return e.CompareProgress(ref, test, ids, seqLen, maxSeqs, nil)
}

// CompareProgress is Compare telling progress after each pass (a batch of sequences).
func (e *GPU) CompareProgress(ref, test *Model, ids []int, seqLen, maxSeqs int, progress Progress) (Comparison, error) {
	if test.Config.Vocab != ref.Config.Vocab {
		return Comparison{}, fmt.Errorf("model: compare: vocabularies differ (%d vs %d)", ref.Config.Vocab, test.Config.Vocab)
	}
	seqs, err := Sequences(ids, seqLen, maxSeqs)
	if err != nil {
		return Comparison{}, err
	}
	var st tokenStats
	done := 0
	for _, part := range e.passes(seqs) {
		if err := e.comparePass(ref, test, part, &st); err != nil {
			return Comparison{}, err
		}
		done += len(part)
		progress.report(done, len(seqs))
	}
	return st.comparison(len(seqs), seqLen), nil
}

func (e *GPU) comparePass(ref, test *Model, seqs [][]int, st *tokenStats) error {
	xr, err := e.run(ref, seqs)
	if err != nil {
		return fmt.Errorf("reference model: %w", err)
	}
	defer xr.Free()
	xt, err := e.run(test, seqs)
	if err != nil {
		return fmt.Errorf("test model: %w", err)
	}
	defer xt.Free()
	return e.compareStates(ref, test, xr.X, xt.X, seqs, st)
}

// compareStates adds to st the predicted tokens of seqs, given the final hidden states of
// ref at xr and of test at xt [len(seqs), T, Hidden].
func (e *GPU) compareStates(ref, test *Model, xr, xt cuda.DevicePtr, seqs [][]int, st *tokenStats) error {
	return e.perToken(seqs, 4, func(row, n int, out, targets cuda.DevicePtr) error {
		at := 4 * row * e.cfg.Hidden
		lr, err := e.head(ref, xr.Add(at), n, "logits")
		if err != nil {
			return err
		}
		lt, err := e.head(test, xt.Add(at), n, "logits.test")
		if err != nil {
			return err
		}
		return e.rowwise(e.fn.tokenCompare, n, lr, lt, targets, out, int32(e.cfg.Vocab))
	}, func(v []float64) {
		st.add(v[0], v[1], v[2], v[3] == 1)
	})
}

// passes splits seqs into the groups evaluated in one pass each, within batchBytes.
func (e *GPU) passes(seqs [][]int) [][][]int {
	per := max(1, batchBytes/(4*len(seqs[0])*e.cfg.Hidden))
	var out [][][]int
	for s := 0; s < len(seqs); s += per {
		out = append(out, seqs[s:min(s+per, len(seqs))])
	}
	return out
}

// perToken runs kernel over the rows of seqs (one row per token) in head-sized chunks; kernel
// writes width float64s per row into out given the next-token targets (−1 after the last token
// of a sequence); use receives each predicted token's values, in order.
func (e *GPU) perToken(seqs [][]int, width int, kernel func(row, n int, out, targets cuda.DevicePtr) error, use func([]float64)) error {
	S, T := len(seqs), len(seqs[0])
	targets := make([]int32, 0, S*T)
	for _, seq := range seqs {
		for t := range seq {
			next := int32(-1)
			if t+1 < T {
				next = int32(seq[t+1])
			}
			targets = append(targets, next)
		}
	}
	dTargets, err := e.buffer("targets", 4*len(targets))
	if err != nil {
		return err
	}
	if err := e.dev.CopyToDevice(dTargets, cuda.Bytes(targets)); err != nil {
		return err
	}
	chunk := e.headRows(len(targets))
	out, err := e.work("token.out", 8*width*chunk)
	if err != nil {
		return err
	}
	host := make([]byte, 8*width*chunk)
	v := make([]float64, width)
	for r := 0; r < len(targets); r += chunk {
		n := min(chunk, len(targets)-r)
		if err := kernel(r, n, out, dTargets.Add(4*r)); err != nil {
			return err
		}
		if err := e.Synchronize(); err != nil {
			return err
		}
		if err := e.dev.CopyFromDevice(host[:8*width*n], out); err != nil {
			return err
		}
		for i := range n {
			if targets[r+i] < 0 {
				continue
			}
			for j := range v {
				v[j] = math.Float64frombits(binary.LittleEndian.Uint64(host[8*(i*width+j):]))
				if math.IsNaN(v[j]) || math.IsInf(v[j], 0) {
					return fmt.Errorf("model: GPU evaluation: non-finite result at token %d of sequence %d", (r+i)%T, (r+i)/T)
				}
			}
			use(v)
		}
	}
	return nil
}
