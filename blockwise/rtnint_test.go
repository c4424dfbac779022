package blockwise

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// rtnTestRows returns n×k BF16 weights whose groups of gs are each of a random kind: Gaussian,
// tiny (scales that are F16 subnormals or underflow to 0), all zero (signed zeros), one-signed,
// wide (any exponent from 2^−40 to 2^12), or multiples of 2^−9 (exact ties of the division).
func rtnTestRows(r *rand.Rand, n, k, gs int) []byte {
	raw := make([]byte, 2*n*k)
	put := func(i int, v float32) { binary.LittleEndian.PutUint16(raw[2*i:], fp.F32ToBF16(v)) }
	for row := range n {
		for lo := 0; lo < k; lo += gs {
			kind := r.IntN(7)
			for i := row*k + lo; i < row*k+min(lo+gs, k); i++ {
				switch kind {
				case 0:
					put(i, float32(r.NormFloat64()*0.02))
				case 1:
					put(i, float32(r.NormFloat64()*math.Ldexp(1, -20-r.IntN(12))))
				case 2:
					put(i, float32(math.Copysign(0, float64(r.IntN(2)*2-1))))
				case 3:
					put(i, float32(math.Abs(r.NormFloat64())*0.1))
				case 4:
					put(i, -float32(math.Abs(r.NormFloat64())*0.1))
				case 5:
					put(i, float32(math.Ldexp(r.Float64()+1, r.IntN(52)-40)*float64(r.IntN(2)*2-1)))
				default:
					put(i, float32(r.IntN(41)-20)/512)
				}
			}
		}
	}
	return raw
}

// quantizeBoth quantizes raw with the kernel and with the reference.
func quantizeBoth(raw []byte, n, k int, s quant.Scheme) (kernel, ref quant.Tensor, kerr, rerr error) {
	kerr = QuantizeBF16Into(&kernel, raw, n, k, s, Options{})
	useRTNKernel = false
	defer func() { useRTNKernel = true }()
	rerr = QuantizeBF16Into(&ref, raw, n, k, s, Options{})
	return
}

// The kernel gives the reference's scales, zero points and codes, byte for byte, for every
// width, both grids, group sizes from 8 to per-channel and partial last groups.
func TestRTNKernelMatchesReference(t *testing.T) {
	if !hasRTNKernel {
		t.Skip("no AVX2 and F16C")
	}
	r := rand.New(rand.NewPCG(31, 32))
	for _, bits := range []int{2, 3, 4, 8} {
		for _, sym := range []bool{true, false} {
			for _, shape := range []struct{ gs, k int }{{8, 64}, {32, 320}, {32, 328}, {128, 1032}, {quant.PerChannel, 264}} {
				s := quant.Scheme{Bits: bits, GroupSize: shape.gs, Sym: sym}
				n := 41
				raw := rtnTestRows(r, n, shape.k, groupLen(s, shape.k))
				kernel, ref, kerr, rerr := quantizeBoth(raw, n, shape.k, s)
				if kerr != nil || rerr != nil {
					t.Fatalf("%s k %d: kernel %v, reference %v", s, shape.k, kerr, rerr)
				}
				if !equalTensors(&kernel, &ref) {
					t.Fatalf("%s k %d: %s", s, shape.k, firstDifference(&kernel, &ref))
				}
			}
		}
	}
}

func firstDifference(a, b *quant.Tensor) string {
	for i := range a.Scales {
		if math.Float32bits(a.Scales[i]) != math.Float32bits(b.Scales[i]) || a.Zeros[i] != b.Zeros[i] {
			return fmt.Sprintf("group %d: scale %g zero %d, reference %g %d", i, a.Scales[i], a.Zeros[i], b.Scales[i], b.Zeros[i])
		}
	}
	for i := range a.Codes {
		if a.Codes[i] != b.Codes[i] {
			return fmt.Sprintf("weight %d: code %d, reference %d", i, a.Codes[i], b.Codes[i])
		}
	}
	return "equal"
}

// A NaN, an infinity or a group whose scale overflows F16 gives the reference's error.
func TestRTNKernelErrors(t *testing.T) {
	if !hasRTNKernel {
		t.Skip("no AVX2 and F16C")
	}
	const n, k = 9, 256
	s := quant.Scheme{Bits: 4, GroupSize: 32}
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 3e6, -3e38} {
		raw := randomBF16(n, k, 3)
		binary.LittleEndian.PutUint16(raw[2*(5*k+77):], fp.F32ToBF16(bad))
		_, _, kerr, rerr := quantizeBoth(raw, n, k, s)
		if kerr == nil || rerr == nil || kerr.Error() != rerr.Error() {
			t.Errorf("%g: kernel %v, reference %v", bad, kerr, rerr)
		}
	}
}
