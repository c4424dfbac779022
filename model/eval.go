package model

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/qpack-dev/qpack/vec"
)

// Result is a perplexity evaluation: sequences scored independently (no BOS added), each
// position t ≥ 1 predicted from the tokens before it.
type Result struct {
	Perplexity float64 // exp(MeanNLL)
	MeanNLL    float64 // mean negative log-likelihood per predicted token, nats
	Tokens     int     // predicted tokens: Sequences × (seqLen−1)
	Sequences  int
}

// Comparison is a test model (quantized, say) measured against a reference on the same tokens.
type Comparison struct {
	Reference, Test Result
	DeltaPerplexity float64 // Test.Perplexity − Reference.Perplexity
	MeanKL          float64 // mean over predicted tokens of KL(reference ‖ test), nats
	P99KL           float64 // 99th percentile (nearest rank) of the per-token KL
	Top1Agreement   float64 // fraction of tokens whose most likely next token is the same
}

// Sequences cuts ids into consecutive non-overlapping sequences of seqLen tokens, at most
// maxSeqs of them (all that fit when maxSeqs ≤ 0); a partial tail is dropped.
func Sequences(ids []int, seqLen, maxSeqs int) ([][]int, error) {
	if seqLen < 2 {
		return nil, fmt.Errorf("model: sequence length %d: need at least 2 tokens to predict one", seqLen)
	}
	n := len(ids) / seqLen
	if maxSeqs > 0 {
		n = min(n, maxSeqs)
	}
	if n == 0 {
		return nil, fmt.Errorf("model: %d tokens do not fill one sequence of %d", len(ids), seqLen)
	}
	seqs := make([][]int, n)
	for i := range seqs {
		seqs[i] = ids[i*seqLen : (i+1)*seqLen]
	}
	return seqs, nil
}

// Progress is told how many of the total sequences an evaluation has scored.
type Progress func(done, total int)

// report calls p when it is set.
func (p Progress) report(done, total int) {
	if p != nil {
		p(done, total)
	}
}

// Perplexity evaluates m on ids cut by Sequences(ids, seqLen, maxSeqs), with float32 logits
// and float64 log-softmax and sums.
func Perplexity(m *Model, ids []int, seqLen, maxSeqs int) (Result, error) {
	return PerplexityProgress(m, ids, seqLen, maxSeqs, nil)
}

// PerplexityProgress is Perplexity telling progress after each sequence.
func PerplexityProgress(m *Model, ids []int, seqLen, maxSeqs int, progress Progress) (Result, error) {
	seqs, err := Sequences(ids, seqLen, maxSeqs)
	if err != nil {
		return Result{}, err
	}
	var nll float64
	for i, seq := range seqs {
		logits, err := m.Logits(seq)
		if err != nil {
			return Result{}, err
		}
		nll += sequenceNLL(logits, seq, m.Config.Vocab)
		progress.report(i+1, len(seqs))
	}
	return newResult(nll, len(seqs), seqLen), nil
}

// sequenceNLL is Σ_t −log softmax(logits[t])[seq[t+1]] over the predicted positions of seq,
// the rows spread over the cores and summed in order.
func sequenceNLL(logits []float32, seq []int, vocab int) float64 {
	nll := make([]float64, len(seq)-1)
	var next atomic.Int64
	parallel(min(runtime.GOMAXPROCS(0), len(nll)), func() {
		scratch := make([]float32, vocab)
		for {
			t := int(next.Add(1) - 1)
			if t >= len(nll) {
				return
			}
			row := logits[t*vocab : (t+1)*vocab]
			nll[t] = logSumExp(row, scratch) - float64(row[seq[t+1]])
		}
	})
	sum := 0.0
	for _, v := range nll {
		sum += v
	}
	return sum
}

// logSumExp is log Σ exp(x), stably: the largest x taken out, exp in float32 (vec.ExpSum), the
// sum and log in float64. scratch holds len(x) values.
func logSumExp(x, scratch []float32) float64 {
	m := vec.Max(x)
	return float64(m) + math.Log(vec.ExpSum(scratch[:len(x)], x, m))
}

// Compare evaluates ref and test on the same sequences and measures how far test's next-token
// distributions are from ref's.
func Compare(ref, test *Model, ids []int, seqLen, maxSeqs int) (Comparison, error) {
	return CompareProgress(ref, test, ids, seqLen, maxSeqs, nil)
}

// CompareProgress is Compare telling progress after each sequence.
func CompareProgress(ref, test *Model, ids []int, seqLen, maxSeqs int, progress Progress) (Comparison, error) {
	vocab := ref.Config.Vocab
	if test.Config.Vocab != vocab {
		return Comparison{}, fmt.Errorf("model: compare: vocabularies differ (%d vs %d)", vocab, test.Config.Vocab)
	}
	seqs, err := Sequences(ids, seqLen, maxSeqs)
	if err != nil {
		return Comparison{}, err
	}
	var st tokenStats
	for i, seq := range seqs {
		lr, err := ref.Logits(seq)
		if err != nil {
			return Comparison{}, fmt.Errorf("reference model: %w", err)
		}
		lt, err := test.Logits(seq)
		if err != nil {
			return Comparison{}, fmt.Errorf("test model: %w", err)
		}
		st.compareLogits(lr, lt, seq, vocab)
		progress.report(i+1, len(seqs))
	}
	return st.comparison(len(seqs), seqLen), nil
}

// tokenStats accumulates Compare's per-token measures.
type tokenStats struct {
	nllRef, nllTest float64
	kls             []float64
	agree           int
}

func (st *tokenStats) add(nllRef, nllTest, kl float64, agree bool) {
	st.nllRef += nllRef
	st.nllTest += nllTest
	st.kls = append(st.kls, kl)
	if agree {
		st.agree++
	}
}

// compareLogits adds the predicted tokens of seq, given the reference's logits lr and the
// test's lt [len(seq), Vocab]; the positions are spread over the cores and added in order.
func (st *tokenStats) compareLogits(lr, lt []float32, seq []int, vocab int) {
	// The negative log-likelihoods as Perplexity sums them, so that both report the same value.
	st.nllRef += sequenceNLL(lr, seq, vocab)
	st.nllTest += sequenceNLL(lt, seq, vocab)
	kls, agree := make([]float64, len(seq)-1), make([]bool, len(seq)-1)
	var next atomic.Int64
	parallel(min(runtime.GOMAXPROCS(0), len(kls)), func() {
		scratch := make([]float32, 2*vocab)
		for {
			t := int(next.Add(1) - 1)
			if t >= len(kls) {
				return
			}
			kls[t], agree[t] = tokenKL(lr[t*vocab:(t+1)*vocab], lt[t*vocab:(t+1)*vocab], scratch)
		}
	})
	for t, kl := range kls {
		st.add(0, 0, kl, agree[t])
	}
}

// tokenKL returns KL(softmax(r) ‖ softmax(t)) for one position's logits, and whether their most
// likely tokens (the first of equals) agree. With p = softmax(r) and the log-sum-exps L_r, L_t,
// KL = Σ p·((r − L_r) − (t − L_t)) = Σ p·(r − t) + L_t − L_r: two exponential passes (vec, float32
// values, float64 sums) and a float64 dot product. scratch holds 2·len(r) values.
func tokenKL(r, t, scratch []float32) (float64, bool) {
	e := scratch[:len(r)]
	mr, mt := vec.Max(r), vec.Max(t)
	sr := vec.ExpSum(e, r, mr)
	st := vec.ExpSum(scratch[len(r):2*len(r)], t, mt)
	t = t[:len(r)]
	var dot float64
	for i, v := range e {
		dot += float64(v) * (float64(r[i]) - float64(t[i]))
	}
	kl := dot/sr + (float64(mt) + math.Log(st)) - (float64(mr) + math.Log(sr))
	return max(kl, 0), slices.Index(r, mr) == slices.Index(t, mt) // rounding can leave a tiny negative
}

func (st *tokenStats) comparison(seqs, seqLen int) Comparison {
	c := Comparison{Reference: newResult(st.nllRef, seqs, seqLen), Test: newResult(st.nllTest, seqs, seqLen)}
	c.DeltaPerplexity = c.Test.Perplexity - c.Reference.Perplexity
	var sum float64
	for _, k := range st.kls {
		sum += k
	}
	c.MeanKL = sum / float64(len(st.kls))
	kls := slices.Clone(st.kls)
	sort.Float64s(kls)
	c.P99KL = kls[int(math.Ceil(0.99*float64(len(kls))))-1]
	c.Top1Agreement = float64(st.agree) / float64(len(kls))
	return c
}

func newResult(nll float64, seqs, seqLen int) Result {
	tokens := seqs * (seqLen - 1)
	mean := nll / float64(tokens)
	return Result{Perplexity: math.Exp(mean), MeanNLL: mean, Tokens: tokens, Sequences: seqs}
}
