package model

import (
	"fmt"
	"io"

	"github.com/qpack-dev/qpack/quantized"
)

// Open loads the model of a Hugging Face checkpoint directory (config.json and safetensors
// shards), plain or quantized in any layout qpack reads (a quantized module is dequantized
// when its block is first used). The checkpoint stays open, memory-mapped, until Close, since blocks are read lazily.
func Open(dir string) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	ckpt, err := quantized.Open(dir)
	if err != nil {
		return nil, err
	}
	m, err := Load(cfg, ckpt)
	if err != nil {
		ckpt.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return m, nil
}

// Close releases the model's weight source when it holds resources (an open checkpoint).
// A block being read (a prefetch in the background) is read to its end first: the weights
// are memory-mapped, and unmapping them under a reader would crash the process.
func (m *Model) Close() error {
	m.mu.Lock()
	m.closed = true
	clear(m.spare)
	m.mu.Unlock()
	m.reading.Wait() // the blocks being read read the weights
	if c, ok := m.weights.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
