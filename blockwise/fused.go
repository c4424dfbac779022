package blockwise

import (
	"fmt"

	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// QuantizeBF16PackGPTQ quantizes W[n, k], raw little-endian BF16 bytes, like
// QuantizeBF16Into(t, …) and packs it like f.PackInto(dst, prefix, t), byte for byte, without
// ever holding all the codes: each goroutine quantizes rowBlock output rows into a small buffer
// and packs them into qweight while they are in cache, which saves writing and re-reading an
// n×k code array. t receives the scheme, shape, scales and zero points but no codes (Codes is
// empty); dst and t are reused as PackInto and QuantizeBF16Into reuse theirs.
func QuantizeBF16PackGPTQ(dst []packing.Raw, t *quant.Tensor, f packing.GPTQ, prefix string, raw []byte, n, k int, s quant.Scheme, opt Options) ([]packing.Raw, error) {
	if len(raw) != 2*n*k {
		return nil, fmt.Errorf("tensor %s: %d bytes of BF16 for a %dx%d tensor (want %d)", prefix, len(raw), n, k, 2*n*k)
	}
	return quantizePackGPTQ(dst, t, f, prefix, bf16Rows{raw: raw, k: k}, n, k, s, opt)
}

// QuantizePackGPTQ is QuantizeBF16PackGPTQ for float32 weights W[n, k], row-major, quantized
// like QuantizeInto.
func QuantizePackGPTQ(dst []packing.Raw, t *quant.Tensor, f packing.GPTQ, prefix string, w []float32, n, k int, s quant.Scheme, opt Options) ([]packing.Raw, error) {
	if len(w) != n*k {
		return nil, fmt.Errorf("tensor %s: %d weights for a %dx%d tensor", prefix, len(w), n, k)
	}
	return quantizePackGPTQ(dst, t, f, prefix, float32Rows{w: w, k: k}, n, k, s, opt)
}

func quantizePackGPTQ(dst []packing.Raw, t *quant.Tensor, f packing.GPTQ, prefix string, src rowSource, n, k int, s quant.Scheme, opt Options) ([]packing.Raw, error) {
	// PackRowsInto checks the scheme and shape from t before it calls back.
	t.Scheme, t.N, t.K, t.GIdx = s, n, k, nil
	return f.PackRowsInto(dst, prefix, t, func(qweight []byte) error {
		return quantizeRows(t, src, n, k, s, opt, func(r0 int, codes []uint8) error {
			return packing.PackGPTQRows(qweight, codes, n, k, s.Bits, r0)
		})
	})
}
