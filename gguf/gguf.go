// Package gguf writes and reads GGUF v3 files, the container of ggml, llama.cpp and ollama,
// with ggml's reference block quantizers for the tensor types qpack exports.
//
// Layout (ggml docs/gguf.md): "GGUF", version 3, tensor count, KV count, the KVs, the tensor
// infos (name, dims innermost first, ggml type, offset in the data section), zero padding to
// the alignment, then the tensor data in tensor-info order, each tensor padded to the
// alignment. ggml's reader is strict: a tensor's offset must be the padded sum of the sizes
// before it, so the writer computes offsets from the sizes and never from positions.
package gguf

import (
	"fmt"
	"strings"
)

// Magic is "GGUF" read as a little-endian uint32.
const Magic = 0x46554747

// Version is the GGUF version written and read.
const Version = 3

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// MaxNameLen bounds tensor names: ggml's GGML_MAX_NAME is 64 including the NUL.
const MaxNameLen = 63

// ValueType is a KV value's type id.
type ValueType uint32

// The GGUF value types.
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

// Type is a ggml tensor type (enum ggml_type).
type Type uint32

// The ggml types qpack writes or reads.
const (
	F32  Type = 0
	F16  Type = 1
	Q4_0 Type = 2
	Q4_1 Type = 3
	Q5_0 Type = 6
	Q5_1 Type = 7
	Q8_0 Type = 8
	Q2_K Type = 10
	Q3_K Type = 11
	Q4_K Type = 12
	Q5_K Type = 13
	Q6_K Type = 14
	BF16 Type = 30
)

// typeInfo is a type's name, elements per block and bytes per block (ggml's type_traits).
type typeInfo struct {
	name      string
	blockSize int
	typeSize  int
}

var types = map[Type]typeInfo{
	F32:  {"F32", 1, 4},
	F16:  {"F16", 1, 2},
	BF16: {"BF16", 1, 2},
	Q4_0: {"Q4_0", 32, 18}, // f16 d; u8 qs[16]
	Q4_1: {"Q4_1", 32, 20}, // f16 d, m; u8 qs[16]
	Q5_0: {"Q5_0", 32, 22}, // f16 d; u8 qh[4]; u8 qs[16]
	Q5_1: {"Q5_1", 32, 24}, // f16 d, m; u8 qh[4]; u8 qs[16]
	Q8_0: {"Q8_0", 32, 34}, // f16 d; i8 qs[32]
	Q2_K: {"Q2_K", 256, 84},
	Q3_K: {"Q3_K", 256, 110},
	Q4_K: {"Q4_K", 256, 144},
	Q5_K: {"Q5_K", 256, 176},
	Q6_K: {"Q6_K", 256, 210},
}

// Known reports whether qpack knows the type's block layout.
func (t Type) Known() bool { _, ok := types[t]; return ok }

func (t Type) String() string {
	if ti, ok := types[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type%d", uint32(t))
}

// BlockSize is the number of elements in one block (1 for float types).
func (t Type) BlockSize() int { return types[t].blockSize }

// TypeSize is the number of bytes of one block.
func (t Type) TypeSize() int { return types[t].typeSize }

// RowBytes is the size of a row of n elements; n must be a multiple of the block size.
func (t Type) RowBytes(n int) int { return n / t.BlockSize() * t.TypeSize() }

// ParseType finds a type by its name ("Q8_0", "q4_k", "f16"…).
func ParseType(name string) (Type, error) {
	for t, ti := range types {
		if strings.EqualFold(ti.name, name) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("unknown ggml type %q", name)
}

// Bytes is the data size of a tensor of type t with dims (innermost first).
func Bytes(t Type, dims []uint64) (int64, error) {
	if !t.Known() {
		return 0, fmt.Errorf("unknown ggml type %d", uint32(t))
	}
	if len(dims) == 0 || len(dims) > 4 {
		return 0, fmt.Errorf("%d dimensions (GGUF allows 1 to 4)", len(dims))
	}
	if dims[0]%uint64(t.BlockSize()) != 0 {
		return 0, fmt.Errorf("row length %d is not a multiple of %s's block size %d", dims[0], t, t.BlockSize())
	}
	n := int64(dims[0]) / int64(t.BlockSize()) * int64(t.TypeSize())
	for _, d := range dims[1:] {
		n *= int64(d)
	}
	return n, nil
}

func pad(n, align int64) int64 { return (n + align - 1) / align * align }
