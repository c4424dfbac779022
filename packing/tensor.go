package packing

import (
	"fmt"

	"github.com/qpack-dev/qpack/quant"
)

// checkTensor verifies that t is internally consistent before it is packed (quant's Validate:
// lengths, code and zero ranges, finite non-zero scales, group indices in range) and that
// act-order comes with groups.
func checkTensor(prefix string, t *quant.Tensor) error {
	if t == nil {
		return fmt.Errorf("tensor %s: nil quantized tensor", prefix)
	}
	if err := t.Validate(); err != nil {
		return fmt.Errorf("tensor %s: %w", prefix, err)
	}
	if t.GIdx != nil && (t.Scheme.Grid == quant.FP8E4M3 || t.Scheme.GroupSize == quant.PerChannel) {
		return fmt.Errorf("tensor %s: act-order group indices need a grouped scheme, not %s", prefix, t.Scheme)
	}
	return nil
}

func checkGIdx(prefix string, gidx []int32, k, groups int) error {
	if len(gidx) != k {
		return fmt.Errorf("tensor %s: %d group indices for %d input channels", prefix, len(gidx), k)
	}
	for i, g := range gidx {
		if g < 0 || int(g) >= groups {
			return fmt.Errorf("tensor %s: group index %d of input channel %d is outside [0, %d)", prefix, g, i, groups)
		}
	}
	return nil
}

// paramGroups is the number of scales per output row: one for FP8, else the scheme's groups.
func paramGroups(s quant.Scheme, k int) int {
	if s.Grid == quant.FP8E4M3 {
		return 1
	}
	return s.Groups(k)
}

// symZero is the fixed zero point of a symmetric integer scheme, 2^(bits−1).
func symZero(s quant.Scheme) int { return (s.MaxQ() + 1) / 2 }

// trivialGIdx reports whether gidx is what the scheme implies without act-order (k / G).
func trivialGIdx(s quant.Scheme, gidx []int32) bool {
	plain := quant.Tensor{Scheme: s}
	for k, g := range gidx {
		if int(g) != plain.Group(k) {
			return false
		}
	}
	return true
}

// plainGIdx returns the act-order-free group index of every input column.
func plainGIdx(t *quant.Tensor) []int32 {
	g := make([]int32, t.K)
	for k := range g {
		g[k] = int32(t.Group(k))
	}
	return g
}

// checkUnpacked validates what a reader decoded, so that a file with, say, a NaN or zero scale
// is reported with the tensor's name instead of dequantizing to garbage.
func checkUnpacked(prefix string, t *quant.Tensor) (*quant.Tensor, error) {
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	return t, nil
}
