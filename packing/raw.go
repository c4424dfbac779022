package packing

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/qpack-dev/qpack/fp"
)

// Raw is one stored tensor as a layout writes or reads it: little-endian bytes in row-major
// order. DType is a safetensors dtype string: "I32", "F16", "F32", "U8", "F8_E4M3" or "I64".
type Raw struct {
	Name  string
	DType string
	Shape []int
	Data  []byte
}

var dtypeSize = map[string]int{"U8": 1, "F8_E4M3": 1, "F16": 2, "I32": 4, "F32": 4, "I64": 8}

// numel is the element count of shape.
func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// expect checks that r has the given dtype and shape and that its bytes match them.
func (r Raw) expect(dtype string, shape ...int) error {
	if r.DType != dtype {
		return fmt.Errorf("tensor %s: dtype %s, want %s", r.Name, r.DType, dtype)
	}
	if !slices.Equal(r.Shape, shape) {
		return fmt.Errorf("tensor %s: shape %v, want %v", r.Name, r.Shape, shape)
	}
	if want := numel(shape) * dtypeSize[dtype]; len(r.Data) != want {
		return fmt.Errorf("tensor %s: %d bytes of data, want %d for %s%v", r.Name, len(r.Data), want, dtype, shape)
	}
	return nil
}

// getter fetches tensors by name and turns a missing one into an error naming it.
type getter func(name string) (Raw, bool)

func (g getter) need(name string) (Raw, error) {
	r, ok := g(name)
	if !ok {
		return Raw{}, fmt.Errorf("tensor %s is missing", name)
	}
	r.Name = name
	return r, nil
}

// wordsRaw encodes 32-bit words as an I32 tensor.
func wordsRaw(name string, words []uint32, shape ...int) Raw {
	data := make([]byte, 4*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint32(data[4*i:], w)
	}
	return Raw{Name: name, DType: "I32", Shape: shape, Data: data}
}

// rawWords decodes the little-endian 32-bit words of an I32 tensor.
func rawWords(r Raw) []uint32 {
	words := make([]uint32, len(r.Data)/4)
	for i := range words {
		words[i] = binary.LittleEndian.Uint32(r.Data[4*i:])
	}
	return words
}

func int32sRaw(name string, v []int32) Raw {
	data := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(data[4*i:], uint32(x))
	}
	return Raw{Name: name, DType: "I32", Shape: []int{len(v)}, Data: data}
}

func rawInt32s(r Raw) []int32 {
	v := make([]int32, len(r.Data)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(r.Data[4*i:]))
	}
	return v
}

// shapeRaw stores [N, K] as I64, as compressed-tensors' weight_shape does.
func shapeRaw(name string, n, k int) Raw {
	data := make([]byte, 16)
	binary.LittleEndian.PutUint64(data, uint64(n))
	binary.LittleEndian.PutUint64(data[8:], uint64(k))
	return Raw{Name: name, DType: "I64", Shape: []int{2}, Data: data}
}

// rawShape reads an I64 [2] shape tensor, refusing non-positive or absurd dimensions.
func rawShape(r Raw) (n, k int, err error) {
	if err := r.expect("I64", 2); err != nil {
		return 0, 0, err
	}
	n64 := int64(binary.LittleEndian.Uint64(r.Data))
	k64 := int64(binary.LittleEndian.Uint64(r.Data[8:]))
	if n64 <= 0 || k64 <= 0 || n64 > 1<<31 || k64 > 1<<31 {
		return 0, 0, fmt.Errorf("tensor %s: bad shape [%d, %d]", r.Name, n64, k64)
	}
	return int(n64), int(k64), nil
}

// f16Raw stores v[i] as F16 at position at(i) of a tensor of the given shape; every value
// must be finite and exactly representable, since quant.Tensor promises F16 scales and a
// silent rounding here would change the dequantized weights.
func f16Raw(name string, v []float32, at func(i int) int, shape ...int) (Raw, error) {
	data := make([]byte, 2*len(v))
	for i, x := range v {
		h, ok := fp.ExactF16(x)
		if !ok {
			return Raw{}, fmt.Errorf("tensor %s: value %g at index %d is not a finite F16 value", name, x, i)
		}
		binary.LittleEndian.PutUint16(data[2*at(i):], h)
	}
	return Raw{Name: name, DType: "F16", Shape: shape, Data: data}, nil
}

// rawF16 decodes an F16 tensor; element j of the file goes to v[at(j)].
func rawF16(r Raw, v []float32, at func(j int) int) {
	for j := range len(r.Data) / 2 {
		v[at(j)] = fp.F16ToF32(binary.LittleEndian.Uint16(r.Data[2*j:]))
	}
}

func identity(i int) int { return i }

// transposed maps index i of a row-major [rows, cols] array to its index in the [cols, rows]
// transpose.
func transposed(rows, cols int) func(i int) int {
	return func(i int) int { return (i%cols)*rows + i/cols }
}

// matrix checks that r is a 2-D tensor of dtype with bytes to match, and returns its shape.
func (r Raw) matrix(dtype string) (rows, cols int, err error) {
	if len(r.Shape) != 2 || r.Shape[0] <= 0 || r.Shape[1] <= 0 {
		return 0, 0, fmt.Errorf("tensor %s: shape %v, want a non-empty matrix", r.Name, r.Shape)
	}
	return r.Shape[0], r.Shape[1], r.expect(dtype, r.Shape...)
}

// f32Raw stores finite float32 values as an F32 tensor.
func f32Raw(name string, v []float32, shape ...int) (Raw, error) {
	data := make([]byte, 4*len(v))
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return Raw{}, fmt.Errorf("tensor %s: value %g at index %d is not finite", name, x, i)
		}
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
	}
	return Raw{Name: name, DType: "F32", Shape: shape, Data: data}, nil
}

// growRaws returns dst with length count, keeping its elements (and their buffers).
func growRaws(dst []Raw, count int) []Raw {
	if cap(dst) < count {
		dst = append(dst[:cap(dst)], make([]Raw, count-cap(dst))...)
	}
	return dst[:count]
}

// reuseRaw makes *r the tensor prefix+suffix of dtype and shape, reusing its name, shape and
// data buffers where it can, and returns it. The data is not cleared.
func reuseRaw(r *Raw, prefix, suffix, dtype string, shape ...int) *Raw {
	if len(r.Name) != len(prefix)+len(suffix) || !strings.HasPrefix(r.Name, prefix) || !strings.HasSuffix(r.Name, suffix) {
		r.Name = prefix + suffix
	}
	r.DType = dtype
	r.Shape = append(r.Shape[:0], shape...)
	size := numel(shape) * dtypeSize[dtype]
	if cap(r.Data) < size {
		r.Data = make([]byte, size)
	}
	r.Data = r.Data[:size]
	return r
}

// putF16Transposed stores v, a row-major [rows, cols] array, as r's F16 [cols, rows] data. Like
// f16Raw it refuses values that are not finite F16 values.
func putF16Transposed(r *Raw, v []float32, rows, cols int) error {
	for i := range rows {
		for j, x := range v[i*cols : (i+1)*cols] {
			h, ok := fp.ExactF16(x)
			if !ok {
				return fmt.Errorf("tensor %s: value %g at index %d is not a finite F16 value", r.Name, x, i*cols+j)
			}
			binary.LittleEndian.PutUint16(r.Data[2*(j*rows+i):], h)
		}
	}
	return nil
}
