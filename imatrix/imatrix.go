// Package imatrix reads and writes llama.cpp's importance-matrix files (imatrix.dat, as
// llama-imatrix writes them and llama-quantize --imatrix reads them): per weight tensor the
// mean of x² over the calibration tokens for each input channel.
//
// Layout (examples/imatrix/imatrix.cpp, llama.cpp c392e509), little-endian int32 counts:
//
//	n_entries
//	n_entries × { name_len, name bytes, ncall, nval, nval × float32 }
//	last_call, dataset_len, dataset bytes   (optional trailer)
//
// An entry's floats are the mean of x² times ncall (the number of matrix products it was
// accumulated over), so readers divide by ncall. Names are llama.cpp tensor names
// ("blk.0.attn_q.weight"); a mixture-of-experts tensor holds every expert's channels, one
// after the other.
package imatrix

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
)

// Entry is one tensor's statistics.
type Entry struct {
	Name  string
	Calls int32     // ncall: matrix products accumulated (llama-imatrix: chunks)
	Mean  []float32 // mean of x² per input channel (the stored values divided by Calls)
}

// File is an importance matrix.
type File struct {
	Entries []Entry
	Chunks  int32  // last_call: chunks of calibration text (0 when the trailer is absent)
	Dataset string // the calibration file's name, as given to the tool that wrote it
}

// Lookup returns the mean x² of the named tensor.
func (f *File) Lookup(name string) ([]float32, bool) {
	for _, e := range f.Entries {
		if e.Name == name {
			return e.Mean, true
		}
	}
	return nil, false
}

// maxName bounds entry names (ggml's names are under 64 bytes; the slack is for prefixes).
const maxName = 1 << 10

// Read reads an imatrix file.
func Read(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	f, err := Decode(bufio.NewReader(fh), st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Decode reads an imatrix of size bytes from r.
func Decode(r io.Reader, size int64) (*File, error) {
	d := &decoder{r: r, left: size}
	n := d.count("entry count", 4+1+4+4+4)
	if d.err == nil && n < 1 {
		return nil, errors.New("no entries (not an imatrix file?)")
	}
	f := &File{}
	seen := map[string]bool{}
	for i := range n {
		e, err := d.entry()
		if err != nil {
			return nil, fmt.Errorf("entry %d of %d: %w", i+1, n, err)
		}
		if seen[e.Name] {
			return nil, fmt.Errorf("entry %d: %s appears twice", i+1, e.Name)
		}
		seen[e.Name] = true
		f.Entries = append(f.Entries, e)
	}
	if d.err != nil {
		return nil, d.err
	}
	if d.left == 0 {
		return f, nil
	}
	f.Chunks = d.i32()
	dl := d.count("dataset name length", 1)
	f.Dataset = string(d.bytes(dl))
	if d.err != nil {
		return nil, fmt.Errorf("trailer: %w", d.err)
	}
	if d.left != 0 {
		return nil, fmt.Errorf("%d bytes after the trailer", d.left)
	}
	return f, nil
}

func (d *decoder) entry() (Entry, error) {
	nameLen := d.count("name length", 1)
	if d.err == nil && (nameLen == 0 || nameLen > maxName) {
		return Entry{}, fmt.Errorf("name length %d", nameLen)
	}
	e := Entry{Name: string(d.bytes(nameLen))}
	e.Calls = d.i32()
	nval := d.count("value count", 4)
	if d.err != nil {
		return Entry{}, d.err
	}
	if nval < 1 {
		return Entry{}, fmt.Errorf("%s: %d values", e.Name, nval)
	}
	if e.Calls < 0 {
		return Entry{}, fmt.Errorf("%s: ncall %d", e.Name, e.Calls)
	}
	raw := d.bytes(4 * nval)
	if d.err != nil {
		return Entry{}, fmt.Errorf("%s: %w", e.Name, d.err)
	}
	e.Mean = make([]float32, nval)
	for i := range e.Mean {
		v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || v < 0 {
			return Entry{}, fmt.Errorf("%s: value %d is %v (want a finite mean of squares)", e.Name, i, v)
		}
		if e.Calls > 0 { // llama-quantize divides by ncall when it is positive
			v /= float32(e.Calls)
		}
		e.Mean[i] = v
	}
	return e, nil
}

// decoder reads little-endian values, keeping the first error and refusing counts that
// could not fit in what is left of the file.
type decoder struct {
	r    io.Reader
	left int64
	err  error
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if int64(n) > d.left {
		d.err = fmt.Errorf("truncated: %d bytes wanted, %d left", n, d.left)
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil {
		d.err = fmt.Errorf("truncated: %w", err)
		return nil
	}
	d.left -= int64(n)
	return b
}

func (d *decoder) i32() int32 {
	b := d.bytes(4)
	if b == nil {
		return 0
	}
	return int32(binary.LittleEndian.Uint32(b))
}

// count reads an int32 count of items of at least min bytes each, refusing one that is
// negative or could not fit.
func (d *decoder) count(what string, min int64) int {
	n := d.i32()
	if d.err == nil && (n < 0 || int64(n)*min > d.left) {
		d.err = fmt.Errorf("%s %d does not fit in the %d bytes left", what, n, d.left)
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

// Write writes f at path in llama.cpp's layout: each entry's means times its Calls (or the
// means as they are when Calls is 0), then the trailer. The file appears only when complete.
func Write(path string, f *File) (err error) {
	if len(f.Entries) == 0 {
		return fmt.Errorf("%s: an imatrix needs at least one entry", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := bufio.NewWriter(tmp)
	if err := f.encode(w); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func (f *File) encode(w io.Writer) error {
	var b []byte
	i32 := func(v int32) { b = binary.LittleEndian.AppendUint32(b, uint32(v)) }
	i32(int32(len(f.Entries)))
	for _, e := range f.Entries {
		if e.Name == "" || len(e.Name) > maxName || len(e.Mean) == 0 || e.Calls < 0 {
			return fmt.Errorf("entry %q: %d values, ncall %d", e.Name, len(e.Mean), e.Calls)
		}
		i32(int32(len(e.Name)))
		b = append(b, e.Name...)
		i32(e.Calls)
		i32(int32(len(e.Mean)))
		for i, v := range e.Mean {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || v < 0 {
				return fmt.Errorf("entry %s: value %d is %v", e.Name, i, v)
			}
			if e.Calls > 0 {
				v *= float32(e.Calls)
			}
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		b = b[:0]
	}
	i32(f.Chunks)
	i32(int32(len(f.Dataset)))
	b = append(b, f.Dataset...)
	_, err := w.Write(b)
	return err
}
