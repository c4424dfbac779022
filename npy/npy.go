// Package npy reads NumPy .npy arrays of the plain numeric dtypes (little-endian, C order),
// which hold the reference token ids and logits that qpack is tested against.
package npy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Array is a decoded .npy array.
type Array struct {
	DType string // NumPy type string without the byte-order mark: "i4", "i8", "f4", "f8"
	Shape []int
	data  []byte
}

// Len is the number of elements.
func (a *Array) Len() int {
	n := 1
	for _, d := range a.Shape {
		n *= d
	}
	return n
}

// ReadFile reads and decodes the .npy file at path.
func ReadFile(path string) (*Array, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	a, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

var (
	descrRe = regexp.MustCompile(`'descr':\s*'([<|=])([a-z]\d+)'`)
	orderRe = regexp.MustCompile(`'fortran_order':\s*(True|False)`)
	shapeRe = regexp.MustCompile(`'shape':\s*\(([^)]*)\)`)
)

var itemSize = map[string]int{"i4": 4, "i8": 8, "f4": 4, "f8": 8, "u1": 1, "i1": 1, "f2": 2}

// Decode parses an in-memory .npy file (format versions 1–3).
func Decode(b []byte) (*Array, error) {
	if len(b) < 10 || !bytes.Equal(b[:6], []byte("\x93NUMPY")) {
		return nil, fmt.Errorf("not a .npy file (bad magic)")
	}
	var hlen, start int
	switch b[6] {
	case 1:
		hlen, start = int(binary.LittleEndian.Uint16(b[8:10])), 10
	case 2, 3:
		if len(b) < 12 {
			return nil, fmt.Errorf("truncated .npy header")
		}
		hlen, start = int(binary.LittleEndian.Uint32(b[8:12])), 12
	default:
		return nil, fmt.Errorf("unsupported .npy version %d", b[6])
	}
	if start+hlen > len(b) {
		return nil, fmt.Errorf("truncated .npy header")
	}
	header := string(b[start : start+hlen])
	m := descrRe.FindStringSubmatch(header)
	if m == nil {
		return nil, fmt.Errorf("unsupported dtype in header %q (want little-endian numeric)", header)
	}
	size, ok := itemSize[m[2]]
	if !ok {
		return nil, fmt.Errorf("unsupported dtype %q", m[2])
	}
	if o := orderRe.FindStringSubmatch(header); o == nil || o[1] == "True" {
		return nil, fmt.Errorf("only C-order arrays are supported")
	}
	sm := shapeRe.FindStringSubmatch(header)
	if sm == nil {
		return nil, fmt.Errorf("no shape in header %q", header)
	}
	a := &Array{DType: m[2], Shape: []int{}}
	for _, f := range strings.Split(sm[1], ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := strconv.Atoi(f)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("bad shape %q", sm[1])
		}
		a.Shape = append(a.Shape, d)
	}
	data := b[start+hlen:]
	if len(data) != a.Len()*size {
		return nil, fmt.Errorf("data is %d bytes, shape %v of %s needs %d", len(data), a.Shape, a.DType, a.Len()*size)
	}
	a.data = data
	return a, nil
}

// Ints returns the elements of an integer array as int.
func (a *Array) Ints() ([]int, error) {
	out := make([]int, a.Len())
	switch a.DType {
	case "i4":
		for i := range out {
			out[i] = int(int32(binary.LittleEndian.Uint32(a.data[4*i:])))
		}
	case "i8":
		for i := range out {
			out[i] = int(int64(binary.LittleEndian.Uint64(a.data[8*i:])))
		}
	default:
		return nil, fmt.Errorf("npy: dtype %s is not an integer type", a.DType)
	}
	return out, nil
}

// Float32s returns the elements of a float array as float32.
func (a *Array) Float32s() ([]float32, error) {
	out := make([]float32, a.Len())
	switch a.DType {
	case "f4":
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(a.data[4*i:]))
		}
	case "f8":
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(a.data[8*i:])))
		}
	default:
		return nil, fmt.Errorf("npy: dtype %s is not a float type", a.DType)
	}
	return out, nil
}

// EncodeInt32s returns a version-1 .npy file of the one-dimensional int32 array v, its header
// padded so that the data starts at a multiple of 64 bytes, as NumPy writes it.
func EncodeInt32s(v []int32) []byte {
	header := fmt.Sprintf("{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", len(v))
	pad := 64 - (10+len(header)+1)%64
	if pad == 64 {
		pad = 0
	}
	header += strings.Repeat(" ", pad) + "\n"
	b := make([]byte, 0, 10+len(header)+4*len(v))
	b = append(b, "\x93NUMPY\x01\x00"...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(header)))
	b = append(b, header...)
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, uint32(x))
	}
	return b
}
