package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// TensorInfo is a tensor as the header describes it.
type TensorInfo struct {
	Name   string
	Type   Type
	Dims   []uint64 // innermost first
	Offset int64    // from the start of the data section
	Size   int64    // bytes, without padding
}

// File is an open GGUF file: its header read and checked, its data read on demand.
type File struct {
	Path       string
	Version    uint32
	KVs        []KV // values decoded to the Go types Write accepts
	Tensors    []TensorInfo
	DataOffset int64 // where the data section starts in the file
	Alignment  int64
	f          *os.File
}

// Open reads and checks a GGUF v3 file's header the way ggml's reader does: known types,
// names under 64 bytes and unique, row lengths divisible by the block size, offsets strictly
// the padded running sum, and all data inside the file.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	g := &File{Path: path, f: f}
	if err := g.readHeader(st.Size()); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return g, nil
}

// Close closes the file.
func (g *File) Close() error { return g.f.Close() }

// Get returns the value of a KV and whether it is present.
func (g *File) Get(key string) (any, bool) {
	for _, kv := range g.KVs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// Tensor finds a tensor by name.
func (g *File) Tensor(name string) (TensorInfo, bool) {
	for _, t := range g.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// Bytes reads a tensor's data.
func (g *File) Bytes(t TensorInfo) ([]byte, error) {
	b := make([]byte, t.Size)
	if _, err := g.f.ReadAt(b, g.DataOffset+t.Offset); err != nil {
		return nil, fmt.Errorf("%s: tensor %s: %w", g.Path, t.Name, err)
	}
	return b, nil
}

// headerReader reads little-endian values, counting bytes and refusing lengths that could
// not fit in the rest of the file (a lying count must not allocate gigabytes).
type headerReader struct {
	r    *bufio.Reader
	n    int64
	size int64
	err  error
}

func (h *headerReader) read(p []byte) {
	if h.err != nil {
		return
	}
	k, err := io.ReadFull(h.r, p)
	h.n += int64(k)
	if err != nil {
		h.err = fmt.Errorf("header truncated at byte %d", h.n)
	}
}

func (h *headerReader) u8() uint8 { var b [1]byte; h.read(b[:]); return b[0] }
func (h *headerReader) u16() uint16 {
	var b [2]byte
	h.read(b[:])
	return binary.LittleEndian.Uint16(b[:])
}
func (h *headerReader) u32() uint32 {
	var b [4]byte
	h.read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}
func (h *headerReader) u64() uint64 {
	var b [8]byte
	h.read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// count reads a u64 length and checks that n items of at least min bytes each fit.
func (h *headerReader) count(what string, min int64) int {
	n := h.u64()
	if h.err == nil && (n > uint64(h.size) || int64(n)*min > h.size-h.n) {
		h.err = fmt.Errorf("%s %d at byte %d exceeds the file size %d", what, n, h.n, h.size)
	}
	if h.err != nil {
		return 0
	}
	return int(n)
}

func (h *headerReader) str() string {
	n := h.count("string length", 1)
	b := make([]byte, n)
	h.read(b)
	return string(b)
}

func (g *File) readHeader(size int64) error {
	h := &headerReader{r: bufio.NewReaderSize(io.NewSectionReader(g.f, 0, size), 1<<16), size: size}
	if m := h.u32(); h.err == nil && m != Magic {
		return fmt.Errorf("not a GGUF file (magic %#x)", m)
	}
	g.Version = h.u32()
	if h.err == nil && g.Version != Version {
		return fmt.Errorf("GGUF version %d, only %d is read", g.Version, Version)
	}
	nt := h.count("tensor count", 8+4+4+8)
	nkv := h.count("KV count", 8+4)
	for range nkv {
		key := h.str()
		v, err := h.value(ValueType(h.u32()), 0)
		if err != nil {
			return fmt.Errorf("KV %s: %w", key, err)
		}
		g.KVs = append(g.KVs, KV{key, v})
	}
	if h.err != nil {
		return h.err
	}
	g.Alignment = DefaultAlignment
	if v, ok := g.Get("general.alignment"); ok {
		a, ok := v.(uint32)
		if !ok || a == 0 || a&(a-1) != 0 {
			return fmt.Errorf("general.alignment %v is not a uint32 power of two", v)
		}
		g.Alignment = int64(a)
	}
	if err := g.readTensorInfos(h, nt); err != nil {
		return err
	}
	g.DataOffset = pad(h.n, g.Alignment)
	if len(g.Tensors) > 0 {
		last := g.Tensors[len(g.Tensors)-1]
		// ggml reads the data section with every tensor padded, the last one included.
		if end := g.DataOffset + last.Offset + pad(last.Size, g.Alignment); end > size {
			return fmt.Errorf("tensor data (padded) ends at byte %d, past the end of the file (%d bytes)", end, size)
		}
	}
	return nil
}

func (g *File) readTensorInfos(h *headerReader, nt int) error {
	seen := map[string]bool{}
	var want int64
	for range nt {
		var t TensorInfo
		t.Name = h.str()
		nd := h.u32()
		if h.err == nil && (nd == 0 || nd > 4) {
			return fmt.Errorf("tensor %s: %d dimensions", t.Name, nd)
		}
		for range nd {
			t.Dims = append(t.Dims, h.u64())
		}
		t.Type = Type(h.u32())
		off := h.u64()
		if h.err != nil {
			return h.err
		}
		if len(t.Name) > MaxNameLen || seen[t.Name] {
			return fmt.Errorf("tensor name %q is too long or duplicated", t.Name)
		}
		seen[t.Name] = true
		n, err := Bytes(t.Type, t.Dims)
		if err != nil {
			return fmt.Errorf("tensor %s: %w", t.Name, err)
		}
		if off != uint64(want) {
			return fmt.Errorf("tensor %s has offset %d, expected %d", t.Name, off, want)
		}
		t.Offset, t.Size = want, n
		want += pad(n, g.Alignment)
		g.Tensors = append(g.Tensors, t)
	}
	return nil
}

var errNesting = errors.New("arrays nested too deep")

// value reads one value of type vt; depth bounds nested arrays.
func (h *headerReader) value(vt ValueType, depth int) (any, error) {
	var v any
	switch vt {
	case TypeUint8:
		v = h.u8()
	case TypeInt8:
		v = int8(h.u8())
	case TypeUint16:
		v = h.u16()
	case TypeInt16:
		v = int16(h.u16())
	case TypeUint32:
		v = h.u32()
	case TypeInt32:
		v = int32(h.u32())
	case TypeFloat32:
		v = math.Float32frombits(h.u32())
	case TypeBool:
		b := h.u8()
		if h.err == nil && b > 1 {
			return nil, fmt.Errorf("bool byte %d", b)
		}
		v = b == 1
	case TypeString:
		v = h.str()
	case TypeUint64:
		v = h.u64()
	case TypeInt64:
		v = int64(h.u64())
	case TypeFloat64:
		v = math.Float64frombits(h.u64())
	case TypeArray:
		if depth > 4 {
			return nil, errNesting
		}
		return h.array(depth)
	default:
		return nil, fmt.Errorf("unknown value type %d", vt)
	}
	return v, h.err
}

// array reads an array into the typed slice Write accepts ([]any for nested arrays).
func (h *headerReader) array(depth int) (any, error) {
	et := ValueType(h.u32())
	n := h.count("array length", 1)
	if h.err != nil {
		return nil, h.err
	}
	switch et {
	case TypeUint8:
		return readSlice(h, n, et, depth, func(v any) uint8 { return v.(uint8) })
	case TypeInt8:
		return readSlice(h, n, et, depth, func(v any) int8 { return v.(int8) })
	case TypeUint16:
		return readSlice(h, n, et, depth, func(v any) uint16 { return v.(uint16) })
	case TypeInt16:
		return readSlice(h, n, et, depth, func(v any) int16 { return v.(int16) })
	case TypeUint32:
		return readSlice(h, n, et, depth, func(v any) uint32 { return v.(uint32) })
	case TypeInt32:
		return readSlice(h, n, et, depth, func(v any) int32 { return v.(int32) })
	case TypeFloat32:
		return readSlice(h, n, et, depth, func(v any) float32 { return v.(float32) })
	case TypeBool:
		return readSlice(h, n, et, depth, func(v any) bool { return v.(bool) })
	case TypeString:
		return readSlice(h, n, et, depth, func(v any) string { return v.(string) })
	case TypeUint64:
		return readSlice(h, n, et, depth, func(v any) uint64 { return v.(uint64) })
	case TypeInt64:
		return readSlice(h, n, et, depth, func(v any) int64 { return v.(int64) })
	case TypeFloat64:
		return readSlice(h, n, et, depth, func(v any) float64 { return v.(float64) })
	case TypeArray:
		return readSlice(h, n, et, depth, func(v any) any { return v })
	}
	return nil, fmt.Errorf("unknown array element type %d", et)
}

func readSlice[T any](h *headerReader, n int, et ValueType, depth int, conv func(any) T) ([]T, error) {
	out := make([]T, 0, min(n, 1<<16))
	for range n {
		v, err := h.value(et, depth+1)
		if err != nil {
			return nil, err
		}
		out = append(out, conv(v))
	}
	return out, nil
}
