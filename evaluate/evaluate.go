// Package evaluate measures a checkpoint on held-out data — perplexity, and against a
// reference checkpoint KL divergence and top-1 agreement — and checks the thresholds that
// `qpack verify` enforces.
package evaluate

import (
	"fmt"
	"strings"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/dataset"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/tokenizer"
)

// Options say what to evaluate on.
type Options struct {
	Data      string // .npy token ids, or text tokenized with the model's tokenizer.json
	SeqLen    int    // tokens per sequence (default 512)
	MaxSeqs   int    // at most this many sequences (0: all that fit)
	Reference string // optional reference checkpoint for KL divergence and top-1 agreement
	Device    string // auto (default), cpu or cuda
	TF32      bool   // GPU: TF32 GEMMs (faster, relative errors near 3e-4)
	Logf      func(format string, args ...any)
	// Progress, when set, is told of the sequences scored (after each sequence on the CPU, each
	// pass of several sequences on the GPU).
	Progress model.Progress
}

// Report is what `qpack eval` prints.
type Report struct {
	Model      string  `json:"model"`
	Data       string  `json:"data"`
	SeqLen     int     `json:"seq_len"`
	Sequences  int     `json:"sequences"`
	Tokens     int     `json:"tokens"` // predicted tokens
	Perplexity float64 `json:"perplexity"`
	// With a reference:
	Reference           string  `json:"reference,omitempty"`
	ReferencePerplexity float64 `json:"reference_perplexity,omitempty"`
	DeltaPerplexity     float64 `json:"delta_perplexity,omitempty"`
	MeanKL              float64 `json:"mean_kl,omitempty"`
	P99KL               float64 `json:"p99_kl,omitempty"`
	Top1Agreement       float64 `json:"top1_agreement,omitempty"`
	Device              string  `json:"device"` // "cpu" or the GPU's name
	Seconds             float64 `json:"seconds"`
}

// evaluator is the forward pass an evaluation runs on: the CPU's or a GPU's.
type evaluator struct {
	perplexity func(m *model.Model, ids []int, seqLen, maxSeqs int, p model.Progress) (model.Result, error)
	compare    func(ref, test *model.Model, ids []int, seqLen, maxSeqs int, p model.Progress) (model.Comparison, error)
	name       string
	close      func()
}

// newEvaluator opens the device opt.Device names for models of architecture cfg.
func newEvaluator(cfg *model.Config, opt Options) (*evaluator, error) {
	cpu := &evaluator{perplexity: model.PerplexityProgress, compare: model.CompareProgress, name: "cpu", close: func() {}}
	dev, note, err := cuda.Select(opt.Device)
	if err != nil || dev == nil {
		if note != "" && opt.Logf != nil {
			opt.Logf("%s\n", note)
		}
		return cpu, err
	}
	e, err := model.NewGPU(dev, cfg, model.GPUOptions{TF32: opt.TF32})
	if err != nil {
		dev.Close()
		return nil, err
	}
	return &evaluator{perplexity: e.PerplexityProgress, compare: e.CompareProgress, name: dev.Info().Name,
		close: func() { e.Close(); dev.Close() }}, nil
}

// Run evaluates the checkpoint at dir.
func Run(dir string, opt Options) (*Report, error) {
	start := time.Now()
	if opt.SeqLen == 0 {
		opt.SeqLen = 512
	}
	m, err := Open(dir)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	ids, err := loadIDs(opt.Data, dir)
	if err != nil {
		return nil, err
	}
	ev, err := newEvaluator(m.Config, opt)
	if err != nil {
		return nil, err
	}
	defer ev.close()
	r := &Report{Model: dir, Data: opt.Data, SeqLen: opt.SeqLen, Device: ev.name}
	if opt.Reference == "" {
		res, err := ev.perplexity(m, ids, opt.SeqLen, opt.MaxSeqs, opt.Progress)
		if err != nil {
			return nil, err
		}
		r.setResult(res)
	} else {
		ref, err := Open(opt.Reference)
		if err != nil {
			return nil, err
		}
		defer ref.Close()
		if ref.Config.Vocab != m.Config.Vocab {
			return nil, fmt.Errorf("%s has a vocabulary of %d, the reference %s of %d", dir, m.Config.Vocab, opt.Reference, ref.Config.Vocab)
		}
		c, err := ev.compare(ref, m, ids, opt.SeqLen, opt.MaxSeqs, opt.Progress)
		if err != nil {
			return nil, err
		}
		r.setResult(c.Test)
		r.Reference, r.ReferencePerplexity = opt.Reference, c.Reference.Perplexity
		r.DeltaPerplexity, r.MeanKL, r.P99KL, r.Top1Agreement = c.DeltaPerplexity, c.MeanKL, c.P99KL, c.Top1Agreement
	}
	r.Seconds = time.Since(start).Seconds()
	return r, nil
}

// Open opens a model to evaluate: a checkpoint directory (plain or quantized), or a GGUF file.
func Open(path string) (*model.Model, error) {
	if ggufexport.IsGGUF(path) {
		return ggufexport.OpenModel(path)
	}
	return model.Open(path)
}

// loadIDs reads the evaluation data; text is tokenized with the model's tokenizer (a GGUF
// file's own, or the checkpoint's tokenizer.json).
func loadIDs(data, path string) ([]int, error) {
	if !ggufexport.IsGGUF(path) {
		return dataset.LoadIDs(data, path)
	}
	return dataset.LoadIDsWith(data, func() (*tokenizer.Tokenizer, error) {
		f, err := gguf.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return ggufexport.Tokenizer(f)
	})
}

func (r *Report) setResult(res model.Result) {
	r.Perplexity, r.Tokens, r.Sequences = res.Perplexity, res.Tokens, res.Sequences
}

// Thresholds are the limits `qpack verify` enforces; zero means unchecked.
type Thresholds struct {
	MaxPerplexity         float64 // absolute perplexity
	MaxPerplexityIncrease float64 // relative: test/reference − 1 (0.02 = 2%)
	MaxKL                 float64 // mean KL divergence, nats
	MaxP99KL              float64
	MinTop1               float64 // top-1 agreement, 0..1
}

// Check returns an error listing every violated threshold, or nil.
func (t Thresholds) Check(r *Report) error {
	var bad []string
	if t.MaxPerplexity > 0 && r.Perplexity > t.MaxPerplexity {
		bad = append(bad, fmt.Sprintf("perplexity %.4f > %.4f", r.Perplexity, t.MaxPerplexity))
	}
	needsRef := t.MaxPerplexityIncrease > 0 || t.MaxKL > 0 || t.MaxP99KL > 0 || t.MinTop1 > 0
	if needsRef && r.Reference == "" {
		return fmt.Errorf("the thresholds on KL, top-1 agreement and perplexity increase need --reference")
	}
	if t.MaxPerplexityIncrease > 0 {
		if inc := r.Perplexity/r.ReferencePerplexity - 1; inc > t.MaxPerplexityIncrease {
			bad = append(bad, fmt.Sprintf("perplexity increase %.2f%% > %.2f%% (%.4f vs %.4f)", 100*inc, 100*t.MaxPerplexityIncrease, r.Perplexity, r.ReferencePerplexity))
		}
	}
	if t.MaxKL > 0 && r.MeanKL > t.MaxKL {
		bad = append(bad, fmt.Sprintf("mean KL %.5f > %.5f", r.MeanKL, t.MaxKL))
	}
	if t.MaxP99KL > 0 && r.P99KL > t.MaxP99KL {
		bad = append(bad, fmt.Sprintf("p99 KL %.5f > %.5f", r.P99KL, t.MaxP99KL))
	}
	if t.MinTop1 > 0 && r.Top1Agreement < t.MinTop1 {
		bad = append(bad, fmt.Sprintf("top-1 agreement %.4f < %.4f", r.Top1Agreement, t.MinTop1))
	}
	if len(bad) > 0 {
		return fmt.Errorf("verification failed: %s", strings.Join(bad, "; "))
	}
	return nil
}
