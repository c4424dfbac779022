package safetensors

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
)

// MaxHeaderSize is the largest header the reference implementation accepts.
const MaxHeaderSize = 100_000_000

// TensorInfo describes one tensor of a file: where its bytes are and how to read them.
type TensorInfo struct {
	Name   string
	DType  DType
	Shape  []int
	File   string // the file holding the tensor
	Offset int64  // start of the tensor's bytes within the file
	Size   int64  // length in bytes
}

// NumElements is the product of the shape (1 for a scalar).
func (t TensorInfo) NumElements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// Header is a parsed and validated safetensors header.
type Header struct {
	Tensors  []TensorInfo // in file order
	Metadata map[string]string
	DataSize int64 // bytes after the header
	DataBase int64 // file offset of the data buffer: 8 + header length
}

type rawEntry struct {
	DType       DType   `json:"dtype"`
	Shape       []int64 `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// ParseHeader parses and validates a header's JSON (the N bytes after the length prefix).
// dataSize is the number of bytes that follow the header in the file; the tensors must tile
// it exactly. file is used in error messages and recorded in each TensorInfo.
func ParseHeader(file string, headerJSON []byte, dataSize int64) (*Header, error) {
	fail := func(format string, args ...any) (*Header, error) {
		return nil, fmt.Errorf("%s: %s", file, fmt.Sprintf(format, args...))
	}
	trimmed := bytes.TrimLeft(headerJSON, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return fail("header is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil {
		return fail("invalid header JSON: %v", err)
	}
	h := &Header{Metadata: map[string]string{}, DataSize: dataSize, DataBase: 8 + int64(len(headerJSON))}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fail("invalid header JSON: %v", err)
		}
		name := tok.(string) // object keys are always strings
		if seen[name] {
			return fail("duplicate key %q in header", name)
		}
		seen[name] = true
		if name == "__metadata__" {
			if err := dec.Decode(&h.Metadata); err != nil {
				return fail("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		var e rawEntry
		if err := dec.Decode(&e); err != nil {
			return fail("tensor %q: invalid entry: %v", name, err)
		}
		t, err := e.info(name, file, h.DataBase)
		if err != nil {
			return fail("%v", err)
		}
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil {
		return fail("invalid header JSON: %v", err)
	}
	if err := checkTiling(h.Tensors, h.DataBase, dataSize); err != nil {
		return fail("%v", err)
	}
	return h, nil
}

// info validates one entry: known dtype, sane shape, and offsets that agree with it.
func (e rawEntry) info(name, file string, base int64) (TensorInfo, error) {
	t := TensorInfo{Name: name, DType: e.DType, File: file}
	if e.DType == "" {
		return t, fmt.Errorf("tensor %q: missing dtype", name)
	}
	if !e.DType.Known() {
		return t, fmt.Errorf("tensor %q: unknown dtype %q", name, e.DType)
	}
	if e.Shape == nil {
		return t, fmt.Errorf("tensor %q: missing shape", name)
	}
	numel := int64(1)
	for _, d := range e.Shape {
		if d < 0 || d > math.MaxInt32*int64(1<<20) {
			return t, fmt.Errorf("tensor %q: invalid dimension %d in shape %v", name, d, e.Shape)
		}
		if d != 0 && numel > math.MaxInt64/8/d {
			return t, fmt.Errorf("tensor %q: shape %v overflows", name, e.Shape)
		}
		numel *= d
		t.Shape = append(t.Shape, int(d))
	}
	if t.Shape == nil {
		t.Shape = []int{}
	}
	if len(e.DataOffsets) != 2 {
		return t, fmt.Errorf("tensor %q: data_offsets must be [begin, end]", name)
	}
	begin, end := e.DataOffsets[0], e.DataOffsets[1]
	if begin < 0 || end < begin {
		return t, fmt.Errorf("tensor %q: invalid data_offsets [%d, %d]", name, begin, end)
	}
	bits := numel * int64(e.DType.Bits())
	if bits%8 != 0 {
		return t, fmt.Errorf("tensor %q: %d elements of %s do not fill whole bytes", name, numel, e.DType)
	}
	if end-begin != bits/8 {
		return t, fmt.Errorf("tensor %q: data_offsets [%d, %d] hold %d bytes, but shape %v of %s needs %d",
			name, begin, end, end-begin, e.Shape, e.DType, bits/8)
	}
	t.Offset, t.Size = base+begin, end-begin
	return t, nil
}

// checkTiling verifies that the tensors cover the data buffer from 0 to its end with no gap
// and no overlap, as the reference implementation requires.
func checkTiling(ts []TensorInfo, base, dataSize int64) error {
	order := make([]int, len(ts))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		ta, tb := ts[order[a]], ts[order[b]]
		if ta.Offset != tb.Offset {
			return ta.Offset < tb.Offset
		}
		return ta.Size < tb.Size
	})
	pos := int64(0)
	for _, i := range order {
		t := ts[i]
		begin := t.Offset - base
		switch {
		case begin < pos:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap the previous tensor (ending at %d)", t.Name, begin, begin+t.Size, pos)
		case begin > pos:
			return fmt.Errorf("tensor %q: data_offsets start at %d, leaving a hole after %d", t.Name, begin, pos)
		}
		pos = begin + t.Size
	}
	if pos != dataSize {
		if pos > dataSize {
			return fmt.Errorf("tensors need %d data bytes but the file has only %d (truncated?)", pos, dataSize)
		}
		return fmt.Errorf("tensors end at %d but the data buffer is %d bytes (trailing bytes)", pos, dataSize)
	}
	return nil
}
