package packing

import (
	"fmt"

	"github.com/qpack-dev/qpack/quant"
)

// FP8Block is the layout of FP8 checkpoints with one scale per B×B block of each weight, as
// DeepSeek-V3's and the Qwen3 FP8 releases store them and transformers (FineGrainedFP8) and
// vLLM (Fp8Config with weight_block_size) load them. For W[N, K]:
//
//	P.weight           F8_E4M3 [N, K]            the E4M3 byte of each weight
//	P.weight_scale_inv F32     [⌈N/B⌉, ⌈K/B⌉]    each block's scale, a multiplier despite the
//	                                            name: w = e4m3(q)·scale
//
// Its config is {"quant_method": "fp8", "weight_block_size": [B, B], …}. It holds the
// fp8-b<B> schemes only.
type FP8Block struct{}

func (FP8Block) Name() string { return "fp8" }

func (FP8Block) MixedSchemes() bool { return false }

func (FP8Block) Supports(s quant.Scheme) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if s.Grid != quant.FP8Block {
		return fmt.Errorf("format fp8 holds block-scaled FP8 (fp8-b128), not %s: use format qpack", s)
	}
	return nil
}

func (f FP8Block) Pack(prefix string, t *quant.Tensor) ([]Raw, error) {
	if err := checkTensor(prefix, t); err != nil {
		return nil, err
	}
	if err := f.Supports(t.Scheme); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	return packMicroscaled(t, fp8MicroNames(prefix))
}

func (FP8Block) Metadata(string, *quant.Tensor) map[string]string { return nil }

func (f FP8Block) Unpack(prefix string, get func(string) (Raw, bool), meta map[string]string) (*quant.Tensor, error) {
	s, err := supportedScheme(f, prefix, meta)
	if err != nil {
		return nil, err
	}
	n, k, err := f.Dims(prefix, get)
	if err != nil {
		return nil, err
	}
	t, err := unpackMicroscaled(getter(get), fp8MicroNames(prefix), s, n, k)
	if err != nil {
		return nil, err
	}
	return checkUnpacked(prefix, t)
}

func (FP8Block) Bytes(s quant.Scheme, n, k int) int64 { return microscaledBytes(s, n, k) }

// TensorNames: weight_scale_inv first, since unquantized modules have a weight too.
func (FP8Block) TensorNames(prefix string) []string {
	return []string{prefix + ".weight_scale_inv", prefix + ".weight"}
}

// Dims: weight is [N, K].
func (FP8Block) Dims(prefix string, get func(string) (Raw, bool)) (n, k int, err error) {
	w, err := getter(get).need(prefix + ".weight")
	if err != nil {
		return 0, 0, err
	}
	if len(w.Shape) != 2 || w.Shape[0] <= 0 || w.Shape[1] <= 0 {
		return 0, 0, fmt.Errorf("tensor %s: shape %v, want a non-empty matrix", w.Name, w.Shape)
	}
	return w.Shape[0], w.Shape[1], nil
}

// fp8MicroNames are the FP8 releases' names for block FP8 tensors (microscaled.go).
func fp8MicroNames(prefix string) microNames {
	return microNames{codes: prefix + ".weight", scales: prefix + ".weight_scale_inv", codesDType: "F8_E4M3"}
}
