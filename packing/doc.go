// Package packing turns quantized tensors (quant.Tensor) into the stored tensors of real
// checkpoint layouts and back: GPTQ (v1 "gptq" and "gptq_v2"), AWQ GEMM, compressed-tensors
// pack-quantized, and qpack's own layout, which holds every scheme qpack produces.
//
// The primitives are PackStream/UnpackStream (b-bit codes as a dense little-endian bitstream
// over bytes or 32-bit words, along any strided axis, caller-owned buffers) and
// PackAWQ4/UnpackAWQ4 (AutoAWQ's interleaved nibbles). Each layout is a Format, found by name
// with Lookup or from a checkpoint with Detect; QuantizationConfig and ParseConfig write and
// read the matching quantization_config of config.json.
//
// Stored tensors are Raw values (name, safetensors dtype string, shape, little-endian bytes),
// independent of any container package.
package packing
