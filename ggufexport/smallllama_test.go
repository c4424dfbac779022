package ggufexport_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/ggufexport"

	"github.com/qpack-dev/qpack/internal/testenv"
)

// TestSmallLlamaGGUFPerplexity exports small-llama (384-wide rows: whole 32-element blocks)
// in each type qpack quantizes to and evaluates the files through the decoders and qpack's
// forward pass. QPACK_GGUF_SEQS sets the number of held-out sequences of 512 (default 4;
// the README's numbers use 64).
func TestSmallLlamaGGUFPerplexity(t *testing.T) {
	if os.Getenv("QPACK_EVAL") != "1" || testing.Short() {
		t.Skip("set QPACK_EVAL=1 (and no -short) for the small-llama GGUF evaluation")
	}
	src := testenv.Shared(t, "models/small-llama")
	seqs := 4
	if s, err := strconv.Atoi(os.Getenv("QPACK_GGUF_SEQS")); err == nil {
		seqs = s
	}
	ref := sourcePerplexity(t, src, src, seqs)
	t.Logf("source (BF16): perplexity %.4f over %d sequences", ref, seqs)
	// Allowed relative perplexity increase per type: generous bounds that still catch a
	// wrong layout (which gives perplexities in the hundreds or thousands).
	bounds := []struct {
		typ string
		max float64
	}{{"f16", 1e-4}, {"q8_0", 0.01}, {"q5_1", 0.05}, {"q5_0", 0.06}, {"q4_1", 0.12}, {"q4_0", 0.15}}
	for _, b := range bounds {
		out := filepath.Join(t.TempDir(), "small-llama-"+b.typ+".gguf")
		start := time.Now()
		if _, err := ggufexport.Export(src, out, ggufexport.Options{Type: b.typ}); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		st, _ := os.Stat(out)
		ppl := ggufPerplexity(t, out, src, src, seqs)
		t.Logf("%-5s %6.2f MB  export %5.2f s  perplexity %.4f (%+.2f%%)", b.typ, float64(st.Size())/1e6, took.Seconds(), ppl, 100*(ppl/ref-1))
		if ppl/ref-1 > b.max || ppl/ref-1 < -b.max {
			t.Errorf("%s: perplexity %.4f against %.4f: more than %.2g relative", b.typ, ppl, ref, b.max)
		}
	}
}
