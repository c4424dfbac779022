// Package awq is activation-aware weight quantization (Lin et al., MLSys 2024, as the llm-awq
// and AutoAWQ code does it): per group of linears sharing an input, search the per-input-channel
// scale s = mean|x|^α that minimises the error of the group's fake-quantized output, fold s into
// the preceding norm or linear so the model is unchanged before quantization, then search a
// clipping range per output row and input group on the scaled weights.
//
// The pure-Go functions here are the reference: Inputs gathers the statistics, SearchScale and
// SearchClip search, ScaleColumns/DivideRows fold. Package convert drives them block by block
// through model.Calibrate.
//
// One deliberate difference from AutoAWQ: the loss of the α search is the mean squared error of
// the concatenated outputs of the group's linears (q|k|v, gate|up), not of the whole attention or
// MLP module that follows them. It needs no attention or activation in the search loop — the
// loss is one GEMM per candidate — and the GPU search runs it as such; for o_proj and down_proj
// the two are the same.
package awq
