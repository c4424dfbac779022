package model

import (
	"path/filepath"
	"testing"
)

// tinyMoEDir is the shared Qwen3-MoE test model (8 experts, top-2, normalized top-k weights).
var tinyMoEDir = filepath.Join(sharedDir(), "models", "tiny-moe")

// TestProbeLogitsSharedTinyMoE: the fp forward of a trained Qwen3-MoE matches transformers'
// fp32 logits (as small-llama's, its reference was made with bf16-rounded rotary frequencies).
func TestProbeLogitsSharedTinyMoE(t *testing.T) {
	checkProbeLogits(t, openModel(t, tinyMoEDir), tinyMoEDir, 1e-3)
	checkProbeLogits(t, openBF16Reference(t, tinyMoEDir), tinyMoEDir, 1e-5)
}

// TestPerplexitySharedTinyMoE is the whole reference protocol (64 × 512 held-out tokens).
func TestPerplexitySharedTinyMoE(t *testing.T) {
	if !fullEval() {
		t.Skip("set QPACK_EVAL=1 (and no -short) for the full tiny-moe evaluation")
	}
	m := openBF16Reference(t, tinyMoEDir)
	checkPerplexity(t, m, tinyMoEDir, 64, referencePerplexity(t, tinyMoEDir), 0.01)
}
