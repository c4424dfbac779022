package packing

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/qpack-dev/qpack/internal/quanttest"
	"github.com/qpack-dev/qpack/quant"
)

// randomTensor builds a valid quant.Tensor of scheme s with random codes and parameters; with
// actOrder its g_idx is a random permutation cut into groups, as GPTQ's act-order produces.
func randomTensor(rng *rand.Rand, s quant.Scheme, n, k int, actOrder bool) *quant.Tensor {
	if s.Grid == quant.KQuant {
		return quanttest.RandomKQuant(rng, s, n, k)
	}
	if s.Grid.IsMicroscaled() {
		return quanttest.RandomMicroscaled(rng, s, n, k)
	}
	ng := paramGroups(s, k)
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k), Scales: make([]float32, n*ng)}
	for i := range t.Codes {
		if s.Grid == quant.FP8E4M3 {
			c := uint8(rng.IntN(256))
			for c&0x7f == 0x7f { // the two NaN bytes are not codes
				c = uint8(rng.IntN(256))
			}
			t.Codes[i] = c
		} else {
			t.Codes[i] = uint8(rng.IntN(s.MaxQ() + 1))
		}
	}
	for i := range t.Scales {
		v := float32(rng.Float64()*0.1 + 1e-4)
		if s.Grid != quant.FP8E4M3 {
			v = quant.RoundF16(v)
		}
		t.Scales[i] = v
	}
	if s.Grid == quant.Integer {
		t.Zeros = make([]uint8, n*ng)
		for i := range t.Zeros {
			if s.Sym {
				t.Zeros[i] = uint8(symZero(s))
			} else {
				t.Zeros[i] = uint8(rng.IntN(s.MaxQ() + 1))
			}
		}
	}
	if s.Grid == quant.Binary && !s.Sym {
		t.Offsets = make([]float32, n*ng)
		for i := range t.Offsets {
			t.Offsets[i] = quant.RoundF16(float32(rng.NormFloat64() * 0.01))
		}
	}
	if actOrder {
		perm := rng.Perm(k)
		t.GIdx = make([]int32, k)
		for pos, col := range perm {
			t.GIdx[col] = int32(pos / s.GroupSize)
		}
	}
	return t
}

// byName makes Unpack's tensor source from Pack's output.
func byName(raws []Raw) func(string) (Raw, bool) {
	m := map[string]Raw{}
	for _, r := range raws {
		m[r.Name] = r
	}
	return func(name string) (Raw, bool) { r, ok := m[name]; return r, ok }
}

// without drops the named tensor from a tensor source.
func without(get func(string) (Raw, bool), drop string) func(string) (Raw, bool) {
	return func(name string) (Raw, bool) {
		if name == drop {
			return Raw{}, false
		}
		return get(name)
	}
}

// replacing substitutes one tensor in a tensor source.
func replacing(get func(string) (Raw, bool), r Raw) func(string) (Raw, bool) {
	return func(name string) (Raw, bool) {
		if name == r.Name {
			return r, true
		}
		return get(name)
	}
}

// metaFor is the metadata a reader of f gets for tensor t: Config.Meta plus f's own entries.
func metaFor(f Format, prefix string, t *quant.Tensor) map[string]string {
	meta := Config{Scheme: t.Scheme}.Meta()
	for k, v := range f.Metadata(prefix, t) {
		meta[k] = v
	}
	return meta
}

// sameTensor compares two tensors, treating a g_idx that only restates k / G as absent.
func sameTensor(t *testing.T, got, want *quant.Tensor) {
	t.Helper()
	w := *want
	if w.GIdx != nil && trivialGIdx(w.Scheme, w.GIdx) {
		w.GIdx = nil
	}
	g := *got
	if g.GIdx != nil && trivialGIdx(g.Scheme, g.GIdx) {
		g.GIdx = nil
	}
	if !reflect.DeepEqual(&g, &w) {
		t.Fatalf("round trip differs:\n got %s %dx%d codes[:16]=%v zeros[:8]=%v gidx=%v\nwant %s %dx%d codes[:16]=%v zeros[:8]=%v gidx=%v",
			g.Scheme, g.N, g.K, head(g.Codes, 16), head(g.Zeros, 8), g.GIdx != nil,
			w.Scheme, w.N, w.K, head(w.Codes, 16), head(w.Zeros, 8), w.GIdx != nil)
	}
}

func head[T any](s []T, n int) []T { return s[:min(n, len(s))] }
