package gguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"sync/atomic"

	"github.com/qpack-dev/qpack/internal/staged"
)

// KV is one metadata entry. Value is a Go value of a GGUF type: uint8, int8, uint16, int16,
// uint32, int32, float32, bool, string, uint64, int64, float64, or a slice of one of them
// (a GGUF array).
type KV struct {
	Key   string
	Value any
}

// Tensor is one tensor to write. Dims are innermost first (a PyTorch [N, K] weight is
// [K, N]); WriteTo must write exactly the tensor's byte size, and is called once, in order,
// so a model streams out one tensor at a time.
type Tensor struct {
	Name    string
	Type    Type
	Dims    []uint64
	WriteTo func(w io.Writer) error
}

// Write writes a GGUF v3 file at path with the KVs and tensors in the given order. The data
// alignment is general.alignment when a KV sets it (a uint32 power of two), else 32. The
// file is written under a temporary name, flushed to disk and renamed when complete; on error
// nothing is left.
func Write(path string, kvs []KV, tensors []Tensor) error {
	return Stream(path, kvs, tensors, nil, true, func(w *Writer) error {
		for _, t := range tensors {
			tw, err := w.Tensor(t.Name)
			if err != nil {
				return err
			}
			bw := bufio.NewWriterSize(tw, 1<<20)
			if err := t.WriteTo(bw); err != nil {
				return fmt.Errorf("%s: tensor %s: %w", path, t.Name, err)
			}
			if err := bw.Flush(); err != nil {
				return fmt.Errorf("%s: tensor %s: %w", path, t.Name, err)
			}
		}
		return nil
	})
}

// Stream writes a GGUF v3 file at path whose header holds kvs and the tensors' infos (their
// WriteTo is not used) and whose tensor data fill writes through w, in any order and from
// several goroutines at once: the header fixes every tensor's place before any data. When
// fill returns, every tensor must be complete. The file is written under a temporary name
// (leftovers of dead runs are removed, each reported to log) and renamed when complete; with
// sync it is flushed to disk first (staged.File).
func Stream(path string, kvs []KV, tensors []Tensor, log io.Writer, sync bool, fill func(w *Writer) error) error {
	align, err := alignment(kvs)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	sizes, err := checkTensors(tensors)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return staged.File(path, log, sync, func(f *os.File) error {
		w, err := newWriter(f, kvs, tensors, sizes, align)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := fill(w); err != nil {
			return err
		}
		return w.check(path)
	})
}

// Writer places tensor data in a GGUF file whose header is written.
type Writer struct {
	f         *os.File
	header    []byte
	tensors   []Tensor
	dataStart int64
	slots     map[string]*slot
}

// slot is one tensor's place in the file and how much of it has been written.
type slot struct {
	offset, size int64 // absolute offset in the file
	written      atomic.Int64
}

func newWriter(f *os.File, kvs []KV, tensors []Tensor, sizes []int64, align int64) (*Writer, error) {
	header, err := encodeHeader(kvs, tensors, sizes, align)
	if err != nil {
		return nil, err
	}
	w := &Writer{f: f, header: header, tensors: tensors, dataStart: int64(len(header)), slots: map[string]*slot{}}
	off := w.dataStart
	for i, t := range tensors {
		w.slots[t.Name] = &slot{offset: off, size: sizes[i]}
		off += pad(sizes[i], align)
	}
	// The file has its final size from the start; the padding between tensors stays zero.
	if err := f.Truncate(off); err != nil {
		return nil, err
	}
	if _, err := f.WriteAt(header, 0); err != nil {
		return nil, err
	}
	return w, nil
}

func encodeHeader(kvs []KV, tensors []Tensor, sizes []int64, align int64) ([]byte, error) {
	var buf bytes.Buffer
	cw := &countWriter{w: &buf}
	if err := writeHeader(cw, kvs, tensors, sizes, align); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteTensor writes a whole tensor's data. Different tensors may be written concurrently.
func (w *Writer) WriteTensor(name string, data []byte) error {
	s, ok := w.slots[name]
	if !ok {
		return fmt.Errorf("tensor %s is not in the file's header", name)
	}
	if int64(len(data)) != s.size {
		return fmt.Errorf("tensor %s: %d bytes, its type and dims need %d", name, len(data), s.size)
	}
	if _, err := w.f.WriteAt(data, s.offset); err != nil {
		return err
	}
	s.written.Store(s.size)
	return nil
}

// WritePart writes part of a tensor's data, off bytes from its start: a merged tensor whose
// parts (a block's experts) are ready at different times. Parts must not overlap; the tensor is
// complete when their sizes add up to its size. Parts of one tensor may be written concurrently.
func (w *Writer) WritePart(name string, off int64, data []byte) error {
	s, ok := w.slots[name]
	if !ok {
		return fmt.Errorf("tensor %s is not in the file's header", name)
	}
	if off < 0 || off+int64(len(data)) > s.size {
		return fmt.Errorf("tensor %s: %d bytes at %d, past its %d bytes", name, len(data), off, s.size)
	}
	if _, err := w.f.WriteAt(data, s.offset+off); err != nil {
		return err
	}
	s.written.Add(int64(len(data)))
	return nil
}

// Tensor returns a writer that streams one tensor's data from its start: writing more than
// the tensor's size is an error.
func (w *Writer) Tensor(name string) (io.Writer, error) {
	s, ok := w.slots[name]
	if !ok {
		return nil, fmt.Errorf("tensor %s is not in the file's header", name)
	}
	return &tensorStream{f: w.f, s: s, name: name}, nil
}

type tensorStream struct {
	f    *os.File
	s    *slot
	name string
}

func (t *tensorStream) Write(p []byte) (int, error) {
	at := t.s.written.Load()
	if at+int64(len(p)) > t.s.size {
		return 0, fmt.Errorf("tensor %s: more than its %d bytes written", t.name, t.s.size)
	}
	n, err := t.f.WriteAt(p, t.s.offset+at)
	t.s.written.Add(int64(n))
	return n, err
}

// SetKVs rewrites the header with new KVs that encode to the same number of bytes (final
// values of fields that were sized with placeholders, such as digests).
func (w *Writer) SetKVs(kvs []KV) error {
	sizes := make([]int64, len(w.tensors))
	for i, t := range w.tensors {
		sizes[i] = w.slots[t.Name].size
	}
	align, err := alignment(kvs)
	if err != nil {
		return err
	}
	header, err := encodeHeader(kvs, w.tensors, sizes, align)
	if err != nil {
		return err
	}
	if len(header) != len(w.header) {
		return fmt.Errorf("the new header is %d bytes, the written one %d", len(header), len(w.header))
	}
	if _, err := w.f.WriteAt(header, 0); err != nil {
		return err
	}
	w.header = header
	return nil
}

// check says whether every tensor was written whole.
func (w *Writer) check(path string) error {
	for _, t := range w.tensors {
		s := w.slots[t.Name]
		if got := s.written.Load(); got != s.size {
			return fmt.Errorf("%s: tensor %s: wrote %d bytes, its type and dims need %d", path, t.Name, got, s.size)
		}
	}
	return nil
}

func alignment(kvs []KV) (int64, error) {
	for _, kv := range kvs {
		if kv.Key != "general.alignment" {
			continue
		}
		a, ok := kv.Value.(uint32)
		if !ok || a == 0 || a&(a-1) != 0 {
			return 0, fmt.Errorf("general.alignment must be a uint32 power of two, got %T %v", kv.Value, kv.Value)
		}
		return int64(a), nil
	}
	return DefaultAlignment, nil
}

// checkTensors validates names (unique, < 64 bytes), types and dims, and returns the sizes.
func checkTensors(tensors []Tensor) ([]int64, error) {
	seen := map[string]bool{}
	sizes := make([]int64, len(tensors))
	for i, t := range tensors {
		if t.Name == "" || len(t.Name) > MaxNameLen {
			return nil, fmt.Errorf("tensor name %q: must be 1 to %d bytes", t.Name, MaxNameLen)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("tensor %s appears twice", t.Name)
		}
		seen[t.Name] = true
		n, err := Bytes(t.Type, t.Dims)
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", t.Name, err)
		}
		sizes[i] = n
	}
	return sizes, nil
}

func writeHeader(w *countWriter, kvs []KV, tensors []Tensor, sizes []int64, align int64) error {
	w.u32(Magic)
	w.u32(Version)
	w.u64(uint64(len(tensors)))
	w.u64(uint64(len(kvs)))
	for _, kv := range kvs {
		w.str(kv.Key)
		if err := w.value(kv.Value, true); err != nil {
			return fmt.Errorf("KV %s: %w", kv.Key, err)
		}
	}
	var off int64
	for i, t := range tensors {
		w.str(t.Name)
		w.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			w.u64(d)
		}
		w.u32(uint32(t.Type))
		w.u64(uint64(off))
		off += pad(sizes[i], align)
	}
	if w.err != nil {
		return w.err
	}
	if err := w.zeros(pad(w.n, align) - w.n); err != nil {
		return err
	}
	w.n = 0 // the data section starts here; tensor offsets are relative to it
	return nil
}

// countWriter counts bytes and keeps the first error, so the header code reads straight.
type countWriter struct {
	w   io.Writer
	n   int64 // bytes written since the data section started (before: since the file start)
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

var zeroPad [64]byte

func (c *countWriter) zeros(n int64) error {
	for n > 0 {
		k := min(n, int64(len(zeroPad)))
		c.Write(zeroPad[:k])
		n -= k
	}
	return c.err
}

func (c *countWriter) u32(v uint32) { c.Write(binary.LittleEndian.AppendUint32(nil, v)) }
func (c *countWriter) u64(v uint64) { c.Write(binary.LittleEndian.AppendUint64(nil, v)) }
func (c *countWriter) str(s string) { c.u64(uint64(len(s))); io.WriteString(c, s) }

// value writes v, preceded by its type id when typed is set (array elements carry none).
func (c *countWriter) value(v any, typed bool) error {
	vt, elem, err := valueType(v)
	if err != nil {
		return err
	}
	if typed {
		c.u32(uint32(vt))
	}
	if vt == TypeArray {
		c.u32(uint32(elem.vt))
		c.u64(uint64(elem.n))
		for i := range elem.n {
			if err := c.value(elem.at(i), false); err != nil {
				return err
			}
		}
		return c.err
	}
	switch x := v.(type) {
	case uint8:
		c.Write([]byte{x})
	case int8:
		c.Write([]byte{byte(x)})
	case uint16:
		c.Write(binary.LittleEndian.AppendUint16(nil, x))
	case int16:
		c.Write(binary.LittleEndian.AppendUint16(nil, uint16(x)))
	case uint32:
		c.u32(x)
	case int32:
		c.u32(uint32(x))
	case float32:
		c.u32(math.Float32bits(x))
	case bool:
		b := byte(0)
		if x {
			b = 1
		}
		c.Write([]byte{b})
	case string:
		c.str(x)
	case uint64:
		c.u64(x)
	case int64:
		c.u64(uint64(x))
	case float64:
		c.u64(math.Float64bits(x))
	}
	return c.err
}

// array describes a slice value: element type, length and element access.
type array struct {
	vt ValueType
	n  int
	at func(int) any
}

func valueType(v any) (ValueType, array, error) {
	switch x := v.(type) {
	case uint8:
		return TypeUint8, array{}, nil
	case int8:
		return TypeInt8, array{}, nil
	case uint16:
		return TypeUint16, array{}, nil
	case int16:
		return TypeInt16, array{}, nil
	case uint32:
		return TypeUint32, array{}, nil
	case int32:
		return TypeInt32, array{}, nil
	case float32:
		return TypeFloat32, array{}, nil
	case bool:
		return TypeBool, array{}, nil
	case string:
		return TypeString, array{}, nil
	case uint64:
		return TypeUint64, array{}, nil
	case int64:
		return TypeInt64, array{}, nil
	case float64:
		return TypeFloat64, array{}, nil
	case []uint8:
		return TypeArray, sliceOf(TypeUint8, x), nil
	case []int8:
		return TypeArray, sliceOf(TypeInt8, x), nil
	case []uint16:
		return TypeArray, sliceOf(TypeUint16, x), nil
	case []int16:
		return TypeArray, sliceOf(TypeInt16, x), nil
	case []uint32:
		return TypeArray, sliceOf(TypeUint32, x), nil
	case []int32:
		return TypeArray, sliceOf(TypeInt32, x), nil
	case []float32:
		return TypeArray, sliceOf(TypeFloat32, x), nil
	case []bool:
		return TypeArray, sliceOf(TypeBool, x), nil
	case []string:
		return TypeArray, sliceOf(TypeString, x), nil
	case []uint64:
		return TypeArray, sliceOf(TypeUint64, x), nil
	case []int64:
		return TypeArray, sliceOf(TypeInt64, x), nil
	case []float64:
		return TypeArray, sliceOf(TypeFloat64, x), nil
	case []any: // nested arrays, as Open returns them; the elements must share one type
		et := TypeArray
		for i, e := range x {
			vt, _, err := valueType(e)
			if err != nil {
				return 0, array{}, err
			}
			if i > 0 && vt != et {
				return 0, array{}, fmt.Errorf("array mixes value types %d and %d", et, vt)
			}
			et = vt
		}
		return TypeArray, sliceOf(et, x), nil
	}
	return 0, array{}, fmt.Errorf("value of Go type %T has no GGUF type", v)
}

func sliceOf[T any](vt ValueType, s []T) array {
	return array{vt: vt, n: len(s), at: func(i int) any { return s[i] }}
}
