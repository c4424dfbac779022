// Package ftype holds llama.cpp's file types (Q4_K_M, IQ2_XS, …) and the ggml type
// llama-quantize gives each tensor of a model under one, so that qpack writes the same mix.
//
// The rules are llama_tensor_get_type and the tensor filter of llama_model_quantize_impl in
// src/llama-quant.cpp of llama.cpp c392e509, transcribed with their quirks (counters that
// advance in llama.cpp's tensor order, substring matches on names, the 70B and 8-expert
// special cases, and the fallbacks for rows that do not hold whole blocks).
package ftype

import (
	"fmt"
	"sort"
	"strings"

	"github.com/qpack-dev/qpack/gguf"
)

// FileType is llama.cpp's enum llama_ftype, the value of general.file_type.
type FileType uint32

// The file types llama-quantize writes.
const (
	AllF32      FileType = 0
	MostlyF16   FileType = 1
	MostlyQ4_0  FileType = 2
	MostlyQ4_1  FileType = 3
	MostlyQ8_0  FileType = 7
	MostlyQ5_0  FileType = 8
	MostlyQ5_1  FileType = 9
	MostlyQ2_K  FileType = 10
	MostlyQ3_KS FileType = 11
	MostlyQ3_KM FileType = 12
	MostlyQ3_KL FileType = 13
	MostlyQ4_KS FileType = 14
	MostlyQ4_KM FileType = 15
	MostlyQ5_KS FileType = 16
	MostlyQ5_KM FileType = 17
	MostlyQ6_K  FileType = 18
	IQ2_XXS     FileType = 19
	IQ2_XS      FileType = 20
	MostlyQ2_KS FileType = 21
	IQ3_XS      FileType = 22
	IQ3_XXS     FileType = 23
	IQ1_S       FileType = 24
	IQ4_NL      FileType = 25
	IQ3_S       FileType = 26
	IQ3_M       FileType = 27
	IQ2_S       FileType = 28
	IQ2_M       FileType = 29
	IQ4_XS      FileType = 30
	IQ1_M       FileType = 31
	MostlyBF16  FileType = 32
	TQ1_0       FileType = 36
	TQ2_0       FileType = 37
	// MostlyMXFP4MoE is the file type of MXFP4 files (llama.h LLAMA_FTYPE_MOSTLY_MXFP4_MOE,
	// newer than the llama.cpp the presets follow): written as general.file_type, no preset.
	MostlyMXFP4MoE FileType = 38
)

// info is a file type's llama-quantize name and the ggml type its tensors start from.
type info struct {
	name string
	base gguf.Type
}

var fileTypes = map[FileType]info{
	AllF32: {"F32", gguf.F32}, MostlyF16: {"F16", gguf.F16}, MostlyBF16: {"BF16", gguf.BF16},
	MostlyQ4_0: {"Q4_0", gguf.Q4_0}, MostlyQ4_1: {"Q4_1", gguf.Q4_1}, MostlyQ5_0: {"Q5_0", gguf.Q5_0},
	MostlyQ5_1: {"Q5_1", gguf.Q5_1}, MostlyQ8_0: {"Q8_0", gguf.Q8_0},
	MostlyQ2_K: {"Q2_K", gguf.Q2_K}, MostlyQ2_KS: {"Q2_K_S", gguf.Q2_K},
	MostlyQ3_KS: {"Q3_K_S", gguf.Q3_K}, MostlyQ3_KM: {"Q3_K_M", gguf.Q3_K}, MostlyQ3_KL: {"Q3_K_L", gguf.Q3_K},
	MostlyQ4_KS: {"Q4_K_S", gguf.Q4_K}, MostlyQ4_KM: {"Q4_K_M", gguf.Q4_K},
	MostlyQ5_KS: {"Q5_K_S", gguf.Q5_K}, MostlyQ5_KM: {"Q5_K_M", gguf.Q5_K}, MostlyQ6_K: {"Q6_K", gguf.Q6_K},
	IQ2_XXS: {"IQ2_XXS", gguf.IQ2_XXS}, IQ2_XS: {"IQ2_XS", gguf.IQ2_XS}, IQ2_S: {"IQ2_S", gguf.IQ2_XS},
	IQ2_M: {"IQ2_M", gguf.IQ2_S}, IQ1_S: {"IQ1_S", gguf.IQ1_S}, IQ1_M: {"IQ1_M", gguf.IQ1_M},
	IQ3_XXS: {"IQ3_XXS", gguf.IQ3_XXS}, IQ3_XS: {"IQ3_XS", gguf.IQ3_S}, IQ3_S: {"IQ3_S", gguf.IQ3_S},
	IQ3_M: {"IQ3_M", gguf.IQ3_S}, IQ4_NL: {"IQ4_NL", gguf.IQ4_NL}, IQ4_XS: {"IQ4_XS", gguf.IQ4_XS},
	TQ1_0: {"TQ1_0", gguf.TQ1_0}, TQ2_0: {"TQ2_0", gguf.TQ2_0},
}

// aliases are llama-quantize's other names for a file type.
var aliases = map[string]FileType{"Q3_K": MostlyQ3_KM, "Q4_K": MostlyQ4_KM, "Q5_K": MostlyQ5_KM}

func (f FileType) String() string {
	if i, ok := fileTypes[f]; ok {
		return i.name
	}
	return fmt.Sprintf("ftype%d", uint32(f))
}

// Base is the ggml type the file type's tensors get before the per-tensor rules.
func (f FileType) Base() gguf.Type { return fileTypes[f].base }

// Names lists the file types by name, as llama-quantize accepts them.
func Names() []string {
	var s []string
	for _, i := range fileTypes {
		s = append(s, i.name)
	}
	sort.Strings(s)
	return s
}

// Parse reads a file type name as llama-quantize does (case-insensitive; Q4_K means Q4_K_M).
func Parse(name string) (FileType, error) {
	up := strings.ToUpper(strings.TrimSpace(name))
	if f, ok := aliases[up]; ok {
		return f, nil
	}
	for f, i := range fileTypes {
		if i.name == up {
			return f, nil
		}
	}
	return 0, fmt.Errorf("unknown llama.cpp file type %q (known: %s)", name, strings.Join(Names(), ", "))
}

// quantized reports whether ggml type t is a block-quantized type (ggml_is_quantized).
func quantized(t gguf.Type) bool { return t.BlockSize() > 1 }

// NeedsImatrix reports whether llama-quantize refuses to quantize the named tensor to t under
// f without an importance matrix ("the result will be garbage"): the 1- and 2-bit lattice
// types, and Q2_K under Q2_K_S outside token_embd.
func NeedsImatrix(f FileType, name string, t gguf.Type) bool {
	switch t {
	case gguf.IQ2_XXS, gguf.IQ2_XS, gguf.IQ2_S, gguf.IQ1_S:
		return true
	case gguf.IQ1_M:
		return name != "token_embd.weight" && name != "output.weight"
	case gguf.Q2_K:
		return f == MostlyQ2_KS && name != "token_embd.weight"
	}
	return false
}

// mostly maps a ggml type to the file type named after it (the _M variant for k-quants).
var mostly = map[gguf.Type]FileType{gguf.F32: AllF32, gguf.F16: MostlyF16, gguf.BF16: MostlyBF16, gguf.Q4_0: MostlyQ4_0,
	gguf.Q4_1: MostlyQ4_1, gguf.Q5_0: MostlyQ5_0, gguf.Q5_1: MostlyQ5_1, gguf.Q8_0: MostlyQ8_0, gguf.Q2_K: MostlyQ2_K,
	gguf.Q3_K: MostlyQ3_KM, gguf.Q4_K: MostlyQ4_KM, gguf.Q5_K: MostlyQ5_KM, gguf.Q6_K: MostlyQ6_K,
	gguf.IQ2_XXS: IQ2_XXS, gguf.IQ2_XS: IQ2_XS, gguf.IQ2_S: IQ2_S, gguf.IQ3_XXS: IQ3_XXS, gguf.IQ3_S: IQ3_S,
	gguf.IQ1_S: IQ1_S, gguf.IQ1_M: IQ1_M, gguf.IQ4_NL: IQ4_NL, gguf.IQ4_XS: IQ4_XS, gguf.TQ1_0: TQ1_0, gguf.TQ2_0: TQ2_0, gguf.MXFP4: MostlyMXFP4MoE}

// Mostly is the file type of a file whose weights are mostly of type t (general.file_type
// of a mixed file: what llama.cpp reports as the model's type).
func Mostly(t gguf.Type) FileType {
	if f, ok := mostly[t]; ok {
		return f
	}
	return MostlyF16
}

// RequiresImatrix reports whether llama-quantize refuses file type f without an importance
// matrix at all (examples/quantize/quantize.cpp): the 1- and 2-bit lattice types and Q2_K_S.
func RequiresImatrix(f FileType) bool { return f.is(IQ2_XS, IQ2_XXS, IQ2_S, MostlyQ2_KS, IQ1_S, IQ1_M) }
