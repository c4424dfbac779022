package model

import (
	"fmt"
	"testing"

	"github.com/qpack-dev/qpack/internal/synth"
)

func benchForward(b *testing.B, dir string, T int) {
	m := openModel(b, dir)
	ids := heldoutIDs(b, dir)[:T]
	if _, err := m.Logits(ids); err != nil { // loads the blocks outside the timing
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.Logits(ids); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(T*b.N)/b.Elapsed().Seconds(), "tokens/s")
}

func BenchmarkForwardTiny512(b *testing.B)       { benchForward(b, tinyDir, 512) }
func BenchmarkForwardSmallLlama512(b *testing.B) { benchForward(b, smallLlamaDir, 512) }

func benchMatMul(b *testing.B, rows, k, n int) {
	x, w, y := make([]float32, rows*k), make([]float32, n*k), make([]float32, rows*n)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	for i := range w {
		w[i] = float32(i%5) - 2
	}
	for b.Loop() {
		matMulT(y, x, w, nil, rows, k, n)
	}
	b.ReportMetric(2*float64(rows*k*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func BenchmarkMatMul512x384x1024(b *testing.B) { benchMatMul(b, 512, 384, 1024) }
func BenchmarkMatMul512x128x2048(b *testing.B) { benchMatMul(b, 512, 128, 2048) }

// BenchmarkBlockRead reads the blocks of a synthetic mixture of experts (Mixtral's layout, 8
// experts of 5632 × 2048, 1.1 GB of float32 a block) from BF16 safetensors, each block's memory
// recycled into the next as GPTQ's calibration does, with one linear converted at a time and
// with blockReaders at once. The files are read once first, so the page cache holds them.
func BenchmarkBlockRead(b *testing.B) {
	dir := b.TempDir()
	cfg := synth.Config{Layers: 3, Hidden: 2048, Intermediate: 5632, Heads: 16, KVHeads: 4, Vocab: 512, Experts: 8, ExpertsPerToken: 2}
	if err := synth.Write(dir, cfg); err != nil {
		b.Fatal(err)
	}
	m, err := Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	readAll := func() int {
		bytes := 0
		for i := range cfg.Layers {
			blk, err := m.Block(i)
			if err != nil {
				b.Fatal(err)
			}
			for _, v := range blk.owned {
				bytes += 4 * len(v)
			}
			m.RecycleBlock(i)
		}
		return bytes
	}
	readAll()
	for _, readers := range []int{1, 8} {
		b.Run(fmt.Sprintf("readers=%d", readers), func(b *testing.B) {
			defer func(was int) { maxBlockReaders = was }(maxBlockReaders)
			maxBlockReaders = readers
			bytes := 0
			for b.Loop() {
				bytes = readAll()
			}
			b.ReportMetric(float64(bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
