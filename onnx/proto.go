package onnx

import (
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// ONNX TensorProto data types (onnx.proto DataType) that the export writes.
const (
	Float    = 1
	Uint8    = 2
	Int8     = 3
	Int32    = 6
	Int64    = 7
	Bool     = 9
	Float16  = 10
	BFloat16 = 16
	Uint4    = 21
	Int4     = 22
	Uint2    = 25
	Int2     = 26
)

// The messages below are written by hand with protowire; the field numbers are those of
// onnx/onnx.proto (frozen by protobuf's compatibility rules). Each function returns one encoded
// message; a parent embeds it as a length-delimited field.

func appendStr(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendInt(b []byte, num protowire.Number, v int64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

// Attr is an encoded AttributeProto.
type Attr []byte

// IntAttr is an INT attribute.
func IntAttr(name string, v int64) Attr {
	b := appendStr(nil, 1, name)
	b = appendInt(b, 3, v)
	return appendInt(b, 20, 2)
}

// FloatAttr is a FLOAT attribute.
func FloatAttr(name string, v float32) Attr {
	b := appendStr(nil, 1, name)
	b = protowire.AppendTag(b, 2, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, math.Float32bits(v))
	return appendInt(b, 20, 1)
}

// IntsAttr is an INTS attribute.
func IntsAttr(name string, v ...int64) Attr {
	b := appendStr(nil, 1, name)
	for _, x := range v {
		b = appendInt(b, 8, x)
	}
	return appendInt(b, 20, 7)
}

// nodeProto encodes a NodeProto.
func nodeProto(name, op, domain string, inputs, outputs []string, attrs []Attr) []byte {
	var b []byte
	for _, in := range inputs {
		b = appendStr(b, 1, in)
	}
	for _, out := range outputs {
		b = appendStr(b, 2, out)
	}
	b = appendStr(b, 3, name)
	b = appendStr(b, 4, op)
	for _, a := range attrs {
		b = appendBytes(b, 5, a)
	}
	if domain != "" {
		b = appendStr(b, 7, domain)
	}
	return b
}

// tensorHeader encodes a TensorProto's dims, type and name; the caller appends the data
// (raw_data, or external_data with data_location).
func tensorHeader(name string, dtype int32, dims []int64) []byte {
	var b []byte
	for _, d := range dims {
		b = appendInt(b, 1, d)
	}
	b = appendInt(b, 2, int64(dtype))
	return appendStr(b, 8, name)
}

// stringEntry encodes a StringStringEntryProto.
func stringEntry(key, value string) []byte {
	return appendStr(appendStr(nil, 1, key), 2, value)
}

// valueInfo encodes a ValueInfoProto of a tensor; a dimension is a number or a symbolic name.
func valueInfo(name string, elem int32, dims []Dim) []byte {
	var shape []byte
	for _, d := range dims {
		var dim []byte
		if d.Param != "" {
			dim = appendStr(nil, 2, d.Param)
		} else {
			dim = appendInt(nil, 1, d.Value)
		}
		shape = appendBytes(shape, 1, dim)
	}
	tensor := appendInt(nil, 1, int64(elem))
	tensor = appendBytes(tensor, 2, shape)
	typ := appendBytes(nil, 1, tensor)
	return appendBytes(appendStr(nil, 1, name), 2, typ)
}

// Dim is one dimension of a graph input or output: a fixed Value or a symbolic Param.
type Dim struct {
	Value int64
	Param string
}
