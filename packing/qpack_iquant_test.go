package packing

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/quanttest"
	"github.com/qpack-dev/qpack/quant"
)

// An IQ tensor is stored as its ggml blocks: it round-trips, costs ggml's bits per weight to
// the bit (plus the 16-byte shape), and the other layouts refuse it.
func TestQPackIQuantRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	f := QPack{}
	for _, it := range quant.IQTypes() {
		s, _ := quant.IQuantScheme(it)
		iq, _ := s.IQuant()
		const n, k = 3, 512
		qt := quanttest.RandomIQuant(rng, s, n, k)
		raws, err := f.Pack("m", qt)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		var total int64
		for _, r := range raws {
			total += int64(len(r.Data))
		}
		if got := f.Bytes(s, n, k); got != total || float64(8*(total-16))/(n*k) != iq.BitsPerWeight() {
			t.Errorf("%s: Bytes = %d, Pack wrote %d (%g bits per weight, ggml %g)", s, got, total, float64(8*(total-16))/(n*k), iq.BitsPerWeight())
		}
		got, err := f.Unpack("m", byName(raws), metaFor(f, "m", qt))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		sameTensor(t, got, qt)
		for _, other := range []Format{GPTQ{}, CompressedTensors{}, AWQ{}} {
			if err := other.Supports(s); err == nil || !strings.Contains(err.Error(), "use format qpack") {
				t.Errorf("%s holds %s: %v", other.Name(), s, err)
			}
		}
	}
	s, _ := quant.IQuantScheme(quant.IQ2S)
	raws, _ := f.Pack("m", quanttest.RandomIQuant(rng, s, 2, 256))
	raws[1].Data = raws[1].Data[:len(raws[1].Data)-1]
	raws[1].Shape = []int{2, 81}
	if _, err := f.Unpack("m", byName(raws), map[string]string{SchemeKey + ".m": "iq2_s"}); err == nil || !strings.Contains(err.Error(), "qpack_blocks") {
		t.Errorf("short blocks: %v", err)
	}
}
