package packing

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// referenceGPTQ is the GPTQ layout written the plain way: one PackStream per column of
// qweight and per row of qzeros into word slices, then encoded.
func referenceGPTQ(f GPTQ, prefix string, t *quant.Tensor) []Raw {
	s, n, k := t.Scheme, t.N, t.K
	ng := s.Groups(k)
	rows := k * s.Bits / 32
	qweight := make([]uint32, rows*n)
	for c := range n {
		if err := PackStream(qweight[c:], n, t.Codes[c*k:], 1, k, s.Bits); err != nil {
			panic(err)
		}
	}
	zw := PackedLen[uint32](n, s.Bits)
	qzeros := make([]uint32, ng*zw)
	stored := make([]uint8, n)
	for g := range ng {
		for c := range n {
			stored[c] = uint8((int(t.Zeros[c*ng+g]) - f.zeroShift()) & s.MaxQ())
		}
		if err := PackStream(qzeros[g*zw:], 1, stored, 1, n, s.Bits); err != nil {
			panic(err)
		}
	}
	scales, err := f16Raw(prefix+".scales", t.Scales, transposed(n, ng), ng, n)
	if err != nil {
		panic(err)
	}
	return []Raw{wordsRaw(prefix+".qweight", qweight, rows, n), wordsRaw(prefix+".qzeros", qzeros, ng, zw),
		scales, int32sRaw(prefix+".g_idx", plainOrActOrder(t))}
}

func plainOrActOrder(t *quant.Tensor) []int32 {
	if t.GIdx != nil {
		return t.GIdx
	}
	return plainGIdx(t)
}

func sameRaws(t *testing.T, what string, got, want []Raw) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tensors, want %d", what, len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Name != w.Name || g.DType != w.DType || !sameInts(g.Shape, w.Shape) || !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("%s: tensor %d is %s %s %v (%d bytes), want %s %s %v (%d bytes), or their bytes differ",
				what, i, g.Name, g.DType, g.Shape, len(g.Data), w.Name, w.DType, w.Shape, len(w.Data))
		}
	}
}

func sameInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// PackInto (4-bit word assembly, 32-code blocks, reused buffers) must write exactly the bytes
// of the plain packing, for every width and awkward sizes, reusing buffers of another size.
func TestGPTQPackIntoMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	sizes := [][2]int{{1, 32}, {17, 96}, {33, 224}, {5, 1024}, {70, 160}}
	var dst []Raw
	for _, f := range []GPTQ{{}, {V2: true}} {
		for _, s := range intSchemes([]int{2, 3, 4, 8}, []int{32, 128, quant.PerChannel}) {
			for _, nk := range sizes {
				if nk[1]*s.Bits%32 != 0 {
					continue
				}
				x := randomTensor(rng, s, nk[0], nk[1], s.GroupSize == 32 && rng.IntN(2) == 0)
				want := referenceGPTQ(f, "m.p", x)
				var err error
				dst, err = f.PackInto(dst, "m.p", x)
				if err != nil {
					t.Fatal(err)
				}
				sameRaws(t, f.Name()+" "+s.String(), dst, want)
				fresh, err := f.Pack("m.p", x)
				if err != nil {
					t.Fatal(err)
				}
				sameRaws(t, f.Name()+" "+s.String()+" Pack", fresh, want)
			}
		}
	}
}

// A tensor large enough to be packed on several goroutines (when GOMAXPROCS allows).
func TestGPTQPackIntoParallelMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(37, 38))
	x := randomTensor(rng, quant.Scheme{Bits: 4, GroupSize: 128}, 301, 8192, false)
	got, err := GPTQ{}.PackInto(nil, "big", x)
	if err != nil {
		t.Fatal(err)
	}
	sameRaws(t, "4-bit 301x8192", got, referenceGPTQ(GPTQ{}, "big", x))
}

func TestGPTQPackIntoAllocatesNothingWhenReused(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	x := randomTensor(rng, quant.Scheme{Bits: 4, GroupSize: 128}, 64, 512, false)
	dst, err := GPTQ{}.PackInto(nil, "layer.mlp", x)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(5, func() {
		if dst, err = (GPTQ{}).PackInto(dst, "layer.mlp", x); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("PackInto with reused buffers made %v allocations", allocs)
	}
}

func TestGPTQPackIntoRejectsBadCodes(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 36))
	x := randomTensor(rng, quant.Scheme{Bits: 4, GroupSize: 32}, 3, 64, false)
	x.Codes[2*64+41] = 16
	if _, err := (GPTQ{}).PackInto(nil, "m", x); err == nil {
		t.Fatal("a 5-bit code was packed")
	}
	words := make([]byte, 4*8*3)
	if err := packGPTQ4(words, x.Codes, 3, 64); err == nil {
		t.Fatal("packGPTQ4 accepted a 5-bit code")
	}
	if err := packGPTQWeights(words, x); err == nil || !bytes.Contains([]byte(err.Error()), []byte("output row 2, input channels from 32")) {
		t.Fatalf("packGPTQWeights: %v", err)
	}
}
