package model

import (
	"fmt"
	"sync"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/safetensors"
)

// Model is a decoder-only transformer whose weights are float32 in memory. Decoder blocks are
// read from Weights on first use and then kept, so a caller (calibration, quantization) can
// replace a block's linear weights and later forward passes use the replacement.
type Model struct {
	Config *Config
	Embed  []float32 // embed_tokens [Vocab, Hidden]
	Norm   []float32 // final RMSNorm weight [Hidden]
	LMHead *Linear   // [Vocab, Hidden]; shares Embed's data when the embeddings are tied

	weights Weights
	rope    *ropeTable
	mu      sync.Mutex // blocks, loads, closed
	blocks  []*Block
	loads   map[int]*blockLoad   // blocks being read, each by the first caller that asked for it
	spare   map[int][][]float32  // recycled blocks' weight memory, by length, for later reads
	reading sync.WaitGroup       // the reads under way: Close waits for them before the weights go
	closed  bool                 // Close has released the weights: no block can be read any more
	readers int                  // SetBlockReaders
	raw     func(block int) bool // SetRawLinears
}

// blockLoad is one block being read; done is closed once b or err is set.
type blockLoad struct {
	done chan struct{}
	b    *Block
	err  error
}

// Linear is y = x·Wᵀ + Bias with W [Out, In] as PyTorch stores it.
type Linear struct {
	Name    string // module name, e.g. "model.layers.0.self_attn.q_proj"
	Out, In int
	W       []float32
	Bias    []float32 // nil when the module has none
	raw     rawWeight // W as the checkpoint stores it, W nil, in a block read for a GPU pass (SetRawLinears)
}

// rawWeight is a linear's weight in the checkpoint's encoding (a view of its bytes), which a
// GPU engine uploads as it is and widens to float32 there.
type rawWeight struct {
	data  []byte
	dtype safetensors.DType
}

// Forward computes y[rows, Out] = x[rows, In]·Wᵀ + Bias.
func (l *Linear) Forward(y, x []float32, rows int) {
	matMulT(y, x, l.W, l.Bias, rows, l.In, l.Out)
}

// SetWeight replaces W, e.g. with dequantized quantized weights; w must be [Out, In] and finite.
func (l *Linear) SetWeight(w []float32) error {
	if len(w) != l.Out*l.In {
		return fmt.Errorf("model: %s: replacement weight has %d values, want %d×%d", l.Name, len(w), l.Out, l.In)
	}
	if i := fp.FirstNonFinite(w); i >= 0 {
		return fmt.Errorf("model: %s: replacement weight has a non-finite value at index %d", l.Name, i)
	}
	l.W = w
	return nil
}

// Load prepares a model of the given architecture; it reads the embeddings, the final norm and
// lm_head now and the decoder blocks when first used.
func Load(cfg *Config, w Weights) (*Model, error) {
	m := &Model{Config: cfg, weights: w, rope: newRopeTable(cfg), blocks: make([]*Block, cfg.Layers),
		loads: map[int]*blockLoad{}, spare: map[int][][]float32{}}
	var err error
	if m.Embed, err = loadTensor(w, "model.embed_tokens.weight", cfg.Vocab, cfg.Hidden); err != nil {
		return nil, err
	}
	if m.Norm, err = loadTensor(w, "model.norm.weight", cfg.Hidden); err != nil {
		return nil, err
	}
	m.LMHead = &Linear{Name: "lm_head", Out: cfg.Vocab, In: cfg.Hidden}
	if _, ok := w.Shape("lm_head.weight"); !ok && cfg.TieEmbeddings {
		m.LMHead.W = m.Embed
	} else if m.LMHead.W, err = loadTensor(w, "lm_head.weight", cfg.Vocab, cfg.Hidden); err != nil {
		return nil, err
	}
	return m, nil
}

// Block returns decoder block i, reading its weights on first use. Blocks are read without
// holding the model's lock, so several can be read at once (Prefetch) and a block already read
// is returned while another is being read; callers asking for a block being read wait for it.
func (m *Model) Block(i int) (*Block, error) {
	if i < 0 || i >= m.Config.Layers {
		return nil, fmt.Errorf("model: block %d out of range [0, %d)", i, m.Config.Layers)
	}
	m.mu.Lock()
	if b := m.blocks[i]; b != nil {
		m.mu.Unlock()
		return b, nil
	}
	ld := m.loads[i]
	if ld != nil {
		m.mu.Unlock()
		<-ld.done
		return ld.b, ld.err
	}
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("model: block %d read after the model was closed", i)
	}
	ld = &blockLoad{done: make(chan struct{})}
	m.loads[i] = ld
	m.reading.Add(1)
	readers := m.readers
	raw := m.raw != nil && m.raw(i)
	m.mu.Unlock()

	ld.b, ld.err = loadBlock(m.Config, &tensorReader{w: m.weights, spare: m.takeSpare, readers: readers, raw: raw}, m.rope, i)
	if ld.err == nil && ld.b.releaseRawPages != nil {
		release := ld.b.releaseRawPages
		ld.b.releaseRawPages = func() { m.inBackground(release) } // (madvise over hundreds of MB: off the uploads' path)
	}
	m.mu.Lock()
	delete(m.loads, i) // after an error, the next caller tries again
	if ld.err == nil {
		m.blocks[i] = ld.b
	}
	m.mu.Unlock()
	m.reading.Done()
	close(ld.done)
	return ld.b, ld.err
}

// inBackground runs f on a goroutine that Close waits for, unless the model is closed (f
// releases pages of the weights' mappings, which Close unmaps).
func (m *Model) inBackground(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.reading.Add(1)
	go func() {
		defer m.reading.Done()
		f()
	}()
}

// SetBlockReaders makes every block's linears read and converted n at a time (a block of experts
// reads several at once by default, a dense block one). A pass that does little with each block,
// as a plan's statistics and output probe on GPUs, waits for its reads: eight threads convert
// 3.3 times as fast as one (BenchmarkBlockRead, 64 cores). Call it before any block is read.
func (m *Model) SetBlockReaders(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.readers = max(n, 1)
}

// SetRawLinears makes Block leave the weights of the linear projections of each block that raw
// says yes to as the checkpoint stores them, without converting them to float32 (W is nil), for
// a pass whose GPU engines only upload them: they go up as BF16 or F16, half the bytes, and are
// widened on the GPU, and the host does not convert them. The bytes are checked finite. Only
// where the Weights hand out their bytes (safetensors checkpoints); others are read as before.
// A block read so must not run on the CPU. Call it before any block is read.
func (m *Model) SetRawLinears(raw func(block int) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.raw = raw
}

// Prefetch starts reading block i in the background (nothing past the last block), so that the
// host's reading and conversion of the next block's weights overlaps the work on this one; an
// error comes back again when the block is used.
func (m *Model) Prefetch(i int) {
	if i >= 0 && i < m.Config.Layers {
		go m.Block(i)
	}
}

// ReleaseBlock drops block i's float32 weights so their memory can be reclaimed. A later use
// reads the block again from the model's Weights, without any replacement made through
// Linear.SetWeight.
func (m *Model) ReleaseBlock(i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i >= 0 && i < len(m.blocks) {
		m.blocks[i] = nil
	}
}

// RecycleBlock is ReleaseBlock for a caller that keeps none of the block's slices (weights,
// norms): their memory is given to later blocks' reads, which then convert into it instead of
// into new pages. Once every later block is read (or being read), nothing will take it: the
// block and the spares kept are released, for the garbage collector to return to the system
// before the process exits (the exit would otherwise free them: a 7B's blocks, 0.1 s).
func (m *Model) RecycleBlock(i int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i < 0 || i >= len(m.blocks) || m.blocks[i] == nil {
		return
	}
	if m.laterUnread(i) {
		for _, v := range m.blocks[i].owned {
			m.spare[len(v)] = append(m.spare[len(v)], v)
		}
	} else {
		clear(m.spare)
	}
	m.blocks[i] = nil
}

// laterUnread says whether a block after i is neither read nor being read (under m.mu).
func (m *Model) laterUnread(i int) bool {
	for j := i + 1; j < len(m.blocks); j++ {
		if m.blocks[j] == nil && m.loads[j] == nil {
			return true
		}
	}
	return false
}

// takeSpare returns a recycled slice of n values, or nil.
func (m *Model) takeSpare(n int) []float32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	free := m.spare[n]
	if len(free) == 0 {
		return nil
	}
	m.spare[n] = free[:len(free)-1]
	return free[len(free)-1]
}

// residentBlocks says which blocks are in memory now.
func (m *Model) residentBlocks() []bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := make([]bool, len(m.blocks))
	for i, b := range m.blocks {
		r[i] = b != nil
	}
	return r
}

// Embedding returns the hidden states [len(ids), Hidden] of the token ids.
func (m *Model) Embedding(ids []int) ([]float32, error) {
	h := m.Config.Hidden
	x := make([]float32, len(ids)*h)
	for t, id := range ids {
		if id < 0 || id >= m.Config.Vocab {
			return nil, fmt.Errorf("model: token id %d at position %d is outside the vocabulary [0, %d)", id, t, m.Config.Vocab)
		}
		copy(x[t*h:(t+1)*h], m.Embed[id*h:(id+1)*h])
	}
	return x, nil
}

// Head applies the final norm and lm_head to hidden states x [T, Hidden]: logits [T, Vocab].
func (m *Model) Head(x []float32, T int) []float32 {
	h := make([]float32, len(x))
	rmsNorm(h, x, m.Norm, T, m.Config.Hidden, m.Config.RMSNormEps)
	logits := make([]float32, T*m.Config.Vocab)
	m.LMHead.Forward(logits, h, T)
	return logits
}

// Logits runs the model over one sequence (no BOS is added) and returns logits [len(ids), Vocab].
func (m *Model) Logits(ids []int) ([]float32, error) {
	x, err := m.Embedding(ids)
	if err != nil {
		return nil, err
	}
	for i := range m.Config.Layers {
		b, err := m.Block(i)
		if err != nil {
			return nil, err
		}
		if err := b.Forward(x, len(ids), nil); err != nil {
			return nil, err
		}
	}
	return m.Head(x, len(ids)), nil
}
