package iquant

import (
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

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
