package packing

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/quant"
)

// PackRowsInto, fed by PackGPTQRows on blocks of rows of uneven sizes, must write exactly the
// bytes of PackInto, for every width, both formats and awkward sizes, reusing buffers.
func TestGPTQPackRowsIntoMatchesPackInto(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	sizes := [][2]int{{1, 32}, {17, 96}, {33, 224}, {70, 160}, {40, 8}}
	var dst []Raw
	for _, f := range []GPTQ{{}, {V2: true}} {
		for _, s := range intSchemes([]int{2, 3, 4, 8}, []int{32, 128, quant.PerChannel}) {
			for _, nk := range sizes {
				n, k := nk[0], nk[1]
				if k*s.Bits%32 != 0 {
					continue
				}
				x := randomTensor(rng, s, n, k, false)
				want, err := f.Pack("m.p", x)
				if err != nil {
					t.Fatal(err)
				}
				params := &quant.Tensor{Scheme: s, N: n, K: k}
				dst, err = f.PackRowsInto(dst, "m.p", params, func(qweight []byte) error {
					for c0 := 0; c0 < n; {
						c1 := min(n, c0+1+rng.IntN(20))
						if err := PackGPTQRows(qweight, x.Codes[c0*k:c1*k], n, k, s.Bits, c0); err != nil {
							return err
						}
						c0 = c1
					}
					params.Scales, params.Zeros = x.Scales, x.Zeros
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				sameRaws(t, f.Name()+" "+s.String()+" by rows", dst, want)
			}
		}
	}
}

func TestGPTQPackRowsRejectsBadInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 44))
	s := quant.Scheme{Bits: 4, GroupSize: 32}
	x := randomTensor(rng, s, 6, 64, false)
	qweight := make([]byte, 4*8*6)
	check := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: want an error containing %q, got %v", what, want, err)
		}
	}
	check("rows past N", PackGPTQRows(qweight, x.Codes[:3*64], 6, 64, 4, 4), "do not fit")
	check("partial row", PackGPTQRows(qweight, x.Codes[:100], 6, 64, 4, 0), "do not fit")
	check("short qweight", PackGPTQRows(qweight[4:], x.Codes[:64], 6, 64, 4, 0), "do not fit")
	check("5-bit width", PackGPTQRows(qweight, x.Codes[:64], 6, 64, 5, 0), "5-bit")
	bad := append([]uint8(nil), x.Codes[:2*64]...)
	bad[64+40] = 16
	check("5-bit code", PackGPTQRows(qweight, bad, 6, 64, 4, 3), "output row 4, input channels from 32")

	params := func() *quant.Tensor { return &quant.Tensor{Scheme: s, N: 6, K: 64} }
	fill := func(p *quant.Tensor, scales []float32, zeros []uint8) func([]byte) error {
		return func(qweight []byte) error {
			p.Scales, p.Zeros = scales, zeros
			return PackGPTQRows(qweight, x.Codes, 6, 64, 4, 0)
		}
	}
	p := params()
	_, err := GPTQ{}.PackRowsInto(nil, "m", p, fill(p, x.Scales[:5], x.Zeros))
	check("missing scales", err, "5 scales")
	zeroScale := append([]float32(nil), x.Scales...)
	zeroScale[7] = 0
	p = params()
	_, err = GPTQ{}.PackRowsInto(nil, "m", p, fill(p, zeroScale, x.Zeros))
	check("zero scale", err, "row 3, group 1")
	bigZero := append([]uint8(nil), x.Zeros...)
	bigZero[2] = 16
	p = params()
	_, err = GPTQ{}.PackRowsInto(nil, "m", p, fill(p, x.Scales, bigZero))
	check("5-bit zero", err, "zero point 16")
	p = params()
	p.GIdx = make([]int32, 64)
	_, err = GPTQ{}.PackRowsInto(nil, "m", p, fill(p, x.Scales, x.Zeros))
	check("act-order", err, "act-order")
	p = &quant.Tensor{Scheme: quant.Scheme{Bits: 4, GroupSize: 32, Grid: quant.NF4, Sym: true}, N: 6, K: 64}
	_, err = GPTQ{}.PackRowsInto(nil, "m", p, fill(p, x.Scales, x.Zeros))
	check("nf4", err, "integer")
}
