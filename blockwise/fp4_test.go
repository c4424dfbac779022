package blockwise

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// microscaledWeights are n×k weights with rows of very different magnitudes, an all-zero block,
// a row of tiny values and outliers: what the scale rules must get right at their edges.
func microscaledWeights(n, k int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 11))
	w := make([]float32, n*k)
	for row := range n {
		mag := math.Exp2(r.Float64()*12 - 9)
		for c := range k {
			v := r.NormFloat64() * mag
			switch {
			case row%5 == 1 && c < 32:
				v = 0
			case row%5 == 2:
				v *= 1e-6
			case r.IntN(100) == 0:
				v *= 12
			}
			w[row*k+c] = float32(v)
		}
	}
	return w
}

// absMaxOf is max |w| over w, in float64 arithmetic on float32 values (exact).
func absMaxOf(w []float32) float32 {
	var m float32
	for _, v := range w {
		m = max(m, float32(math.Abs(float64(v))))
	}
	return m
}

// The FP4 quantizers give exactly what the definitions in quant/microscaled.go say: NVFP4's
// global scale 2688/absmax, block scales E4M3(G·absmax/6), codes E2M1(w/(s/G)); MXFP4's
// 2^(⌊log2 absmax⌋−2) and E2M1(w/s). The input's dtype does not change the result.
func TestFP4RTNMatchesDefinition(t *testing.T) {
	const n, k = 37, 96
	w := microscaledWeights(n, k, 1)
	for _, s := range []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme} {
		got := mustQuantize(t, w, n, k, s, Options{})
		g := quant.NVFP4GlobalScale(absMaxOf(w))
		if s.Grid == quant.MXFP4 {
			g = 0
		}
		if got.GlobalScale != g {
			t.Fatalf("%s: global scale %v, want %v", s, got.GlobalScale, g)
		}
		b := s.GroupSize
		for row := range n {
			for blk := range k / b {
				i := row*(k/b) + blk
				block := w[row*k+blk*b : row*k+(blk+1)*b]
				want, f := quant.MXFP4Scale(absMaxOf(block)), float32(0)
				if s.Grid == quant.NVFP4 {
					want = quant.NVFP4BlockScale(absMaxOf(block), g)
					f = want / g
				} else {
					f = want
				}
				if got.Scales[i] != want {
					t.Fatalf("%s row %d block %d: scale %v, want %v", s, row, blk, got.Scales[i], want)
				}
				for j, v := range block {
					if c, wc := got.Codes[row*k+blk*b+j], fp.F32ToE2M1(v/f); c != wc {
						t.Fatalf("%s row %d col %d: code %d, want %d", s, row, blk*b+j, c, wc)
					}
				}
			}
		}
		bf := toBF16(w)
		viaBF16, err := QuantizeBF16(bf, n, k, s, Options{})
		if err != nil {
			t.Fatal(err)
		}
		fromBF16 := mustQuantize(t, bf16Weights(bf), n, k, s, Options{})
		if !slices.Equal(viaBF16.Codes, fromBF16.Codes) || !slices.Equal(viaBF16.Scales, fromBF16.Scales) || viaBF16.GlobalScale != fromBF16.GlobalScale {
			t.Errorf("%s: BF16 input and its float32 values quantize differently", s)
		}
	}
}

// A global scale given in the options is used as it is, for the shared scale of fused layers.
func TestNVFP4GivenGlobalScale(t *testing.T) {
	const n, k = 8, 64
	w := microscaledWeights(n, k, 2)
	g := quant.NVFP4GlobalScale(3 * absMaxOf(w)) // as if a sibling tensor were 3× larger
	got := mustQuantize(t, w, n, k, quant.NVFP4Scheme, Options{GlobalScale: g})
	if got.GlobalScale != g {
		t.Fatalf("global scale %v, want %v", got.GlobalScale, g)
	}
	if want := quant.NVFP4BlockScale(absMaxOf(w[:16]), g); got.Scales[0] != want {
		t.Errorf("block scale %v, want %v", got.Scales[0], want)
	}
}

// Block FP8 scales each B×B block by its absmax/448, partial blocks at the edges included.
func TestFP8BlockMatchesDefinition(t *testing.T) {
	const n, k, b = 70, 50, 32
	w := microscaledWeights(n, k, 3)
	s := quant.FP8BlockScheme(b)
	got := mustQuantize(t, w, n, k, s, Options{})
	for row := range n {
		for c := range k {
			var amax float32
			for r := row / b * b; r < min(row/b*b+b, n); r++ {
				amax = max(amax, absMaxOf(w[r*k+c/b*b:r*k+min(c/b*b+b, k)]))
			}
			scale := quant.FP8Scale(amax)
			if g := got.Scales[row*2+c/b]; g != scale {
				t.Fatalf("row %d col %d: scale %v, want %v", row, c, g, scale)
			}
			if code, want := got.Codes[row*k+c], quant.FP8Code(w[row*k+c], scale); code != want {
				t.Fatalf("row %d col %d: code %#x, want %#x", row, c, code, want)
			}
		}
	}
}

func TestMicroscaledRefusals(t *testing.T) {
	w := microscaledWeights(4, 64, 4)
	for _, c := range []struct {
		name string
		k    int
		s    quant.Scheme
		opt  Options
		want string
	}{
		{"nvfp4 partial block", 24, quant.NVFP4Scheme, Options{}, "whole blocks"},
		{"mxfp4 partial block", 48, quant.MXFP4Scheme, Options{}, "whole blocks"},
		{"global scale on int4", 64, quant.Scheme{Bits: 4, GroupSize: 32}, Options{GlobalScale: 2}, "global scale"},
		{"global scale on mxfp4", 64, quant.MXFP4Scheme, Options{GlobalScale: 2}, "global scale"},
		{"negative global scale", 64, quant.NVFP4Scheme, Options{GlobalScale: -1}, "global scale"},
		{"fp8 block imatrix", 64, quant.FP8BlockScheme(32), Options{Imatrix: true}, "no clipping or imatrix search"},
		{"fp8 block clip", 64, quant.FP8BlockScheme(32), Options{Clip: true}, "no clipping or imatrix search"},
	} {
		if _, err := Quantize(w[:4*c.k], 4, c.k, c.s, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	for _, s := range []quant.Scheme{quant.NVFP4Scheme, quant.MXFP4Scheme, quant.FP8BlockScheme(32)} {
		bad := slices.Clone(w)
		bad[2*64+40], bad[3*64+1] = float32(math.Inf(-1)), float32(math.NaN())
		if _, err := Quantize(bad, 4, 64, s, Options{}); err == nil || !strings.Contains(err.Error(), "row 2, column 40") {
			t.Errorf("%s: non-finite weight: %v", s, err)
		}
	}
}

func toBF16(w []float32) []byte {
	out := make([]byte, 2*len(w))
	for i, v := range w {
		binary.LittleEndian.PutUint16(out[2*i:], fp.F32ToBF16(v))
	}
	return out
}
