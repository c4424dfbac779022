package model

import "testing"

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
