package blockwise

import (
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// encodeBench times encode on 64 L1-resident groups of 128 weights (int4 asym, as fitted).
func encodeBench(b *testing.B, encode func(q intQuantizer, codes []uint8, w []float32, pr params)) {
	q := intQuantizer{quant.Scheme{Bits: 4, GroupSize: 128}}
	w := randomWeights(64, 128, 3)
	prs := make([]params, 64)
	for g := range prs {
		gw := w[g*128 : (g+1)*128]
		prs[g] = q.fit(gw, minMax(gw), 1)
	}
	codes := make([]uint8, 128)
	b.SetBytes(int64(len(w)))
	for b.Loop() {
		for g, pr := range prs {
			encode(q, codes, w[g*128:(g+1)*128], pr)
		}
	}
}

// BenchmarkIntEncode: the reciprocal encoder; BenchmarkIntEncodeDivision: the definition it
// replaces (one float32 division per weight).
func BenchmarkIntEncode(b *testing.B) {
	encodeBench(b, func(q intQuantizer, codes []uint8, w []float32, pr params) { q.encode(codes, w, pr) })
}

func BenchmarkIntEncodeDivision(b *testing.B) {
	encodeBench(b, func(q intQuantizer, codes []uint8, w []float32, pr params) {
		zero, maxq := int32(pr.zero), int32(q.s.MaxQ())
		for i, v := range w {
			codes[i] = uint8(min(max(int32(roundQuotient(v, pr.scale))+zero, 0), maxq))
		}
	})
}

func BenchmarkMinMax(b *testing.B) {
	w := randomWeights(64, 128, 3)
	b.SetBytes(int64(len(w)))
	var sink span
	for b.Loop() {
		for g := range 64 {
			sink = minMax(w[g*128 : (g+1)*128])
		}
	}
	_ = sink
}

func BenchmarkBF16Segment(b *testing.B) {
	src := bf16Rows{raw: randomBF16(1, 8192, 3), k: 8192}
	buf := make([]float32, 128)
	b.SetBytes(8192)
	for b.Loop() {
		for g := range 64 {
			src.segment(0, g*128, (g+1)*128, buf)
		}
	}
}
