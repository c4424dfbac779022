package iquant

import (
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/safetensors"

	"github.com/qpack-dev/qpack/quant"
)

// BenchmarkQuantize is round-to-nearest of 64×4096 normal weights with importance for every IQ
// type on GOMAXPROCS cores (-cpu 1 for one): MB/s of float32 input, and cpu-MB/s, the same per
// second of the process's CPU time (what a shared machine's load does not change). docs/iq.md
// compares it with ggml_quantize_chunk on the same kind of data.
func BenchmarkQuantize(b *testing.B) {
	const n, k = 64, 4096
	r := rand.New(rand.NewPCG(1, 1))
	w, imp := randomWeights(r, n*k), randomImportance(r, k)
	for _, it := range quant.IQTypes() {
		s, _ := quant.IQuantScheme(it)
		b.Run(s.String(), func(b *testing.B) {
			if typ, _ := TypeOf(s); typ.lat != nil {
				typ.lat() // the search tables are built once per process, outside the timing
			}
			b.SetBytes(4 * n * k)
			cpu0 := cpuTime()
			for b.Loop() {
				if _, err := Quantize(w, n, k, s, imp); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(4*n*k*b.N)/1e6/(cpuTime()-cpu0).Seconds(), "cpu-MB/s")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMidLlama quantizes the 28 decoder linears of the shared mid-llama (skipped without
// it) to iq2_xs, iq3_xxs and iq4_xs with importance 1 on every channel, rows over GOMAXPROCS
// cores: MB/s of float32 input and cpu-MB/s. docs/iq.md compares it with llama-quantize
// --imatrix (the same importance) --pure on the same weights and thread count.
func BenchmarkMidLlama(b *testing.B) {
	ck, err := safetensors.Open(testenv.Shared(b, "models/mid-llama"))
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	type linear struct {
		w    []float32
		n, k int
	}
	var ls []linear
	total := 0
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		if !strings.HasPrefix(name, "model.layers.") || len(info.Shape) != 2 {
			continue
		}
		w, err := ck.Float32(name)
		if err != nil {
			b.Fatal(err)
		}
		ls = append(ls, linear{w, info.Shape[0], info.Shape[1]})
		total += len(w)
	}
	ones := make([]float32, 1536)
	for i := range ones {
		ones[i] = 1
	}
	for _, it := range []quant.IQType{quant.IQ2XS, quant.IQ3XXS, quant.IQ4XS} {
		s, _ := quant.IQuantScheme(it)
		if typ, _ := TypeOf(s); typ.lat != nil {
			typ.lat()
		}
		b.Run(s.String(), func(b *testing.B) {
			b.SetBytes(int64(4 * total))
			cpu0 := cpuTime()
			for b.Loop() {
				for _, l := range ls {
					if _, err := Quantize(l.w, l.n, l.k, s, ones[:l.k]); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(4*total*b.N)/1e6/(cpuTime()-cpu0).Seconds(), "cpu-MB/s")
		})
	}
}
