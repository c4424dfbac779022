package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// WriterTensor is a tensor to be written: its description up front, its bytes on demand, so
// that a checkpoint never has to sit in memory. WriteTo must write exactly the declared size.
type WriterTensor struct {
	Name    string
	DType   DType
	Shape   []int
	WriteTo func(w io.Writer) error
}

// Size is the tensor's byte length implied by dtype and shape.
func (t WriterTensor) Size() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return byteSize(t.DType, n)
}

// BytesTensor is a WriterTensor over bytes already in memory.
func BytesTensor(name string, dtype DType, shape []int, data []byte) WriterTensor {
	return WriterTensor{Name: name, DType: dtype, Shape: shape, WriteTo: func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}}
}

// EncodeHeader builds the header (length prefix included) for tensors written in the given
// order: __metadata__ first with "format": "pt" unless set, padded with spaces to a multiple
// of 8 bytes.
func EncodeHeader(tensors []WriterTensor, metadata map[string]string) ([]byte, error) {
	meta := map[string]string{"format": "pt"}
	for k, v := range metadata {
		meta[k] = v
	}
	var b strings.Builder
	b.WriteString(`{"__metadata__":`)
	mj, _ := json.Marshal(meta) // map keys come out sorted: deterministic
	b.Write(mj)
	seen := map[string]bool{"__metadata__": true}
	offset := int64(0)
	for _, t := range tensors {
		if seen[t.Name] {
			return nil, fmt.Errorf("tensor %q: duplicate or reserved name", t.Name)
		}
		seen[t.Name] = true
		if !t.DType.Known() {
			return nil, fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension in shape %v", t.Name, t.Shape)
			}
			n *= int64(d)
		}
		if n*int64(t.DType.Bits())%8 != 0 {
			return nil, fmt.Errorf("tensor %q: %d elements of %s do not fill whole bytes", t.Name, n, t.DType)
		}
		name, _ := json.Marshal(t.Name)
		shape := make([]string, len(t.Shape))
		for i, d := range t.Shape {
			shape[i] = strconv.Itoa(d)
		}
		size := t.Size()
		fmt.Fprintf(&b, `,%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}`,
			name, t.DType, strings.Join(shape, ","), offset, offset+size)
		offset += size
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	out := make([]byte, 8, 8+b.Len())
	binary.LittleEndian.PutUint64(out, uint64(b.Len()))
	return append(out, b.String()...), nil
}

// Write streams a complete safetensors file to w.
func Write(w io.Writer, tensors []WriterTensor, metadata map[string]string) error {
	header, err := EncodeHeader(tensors, metadata)
	if err != nil {
		return err
	}
	if _, err := w.Write(header); err != nil {
		return err
	}
	for _, t := range tensors {
		if err := writeTensor(w, t); err != nil {
			return err
		}
	}
	return nil
}

// writeTensor runs t.WriteTo and checks that it wrote exactly the declared size, since a
// wrong size would shift or corrupt the tensors after it.
func writeTensor(w io.Writer, t WriterTensor) error {
	cw := &countingWriter{w: w}
	if err := t.WriteTo(cw); err != nil {
		return fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if cw.n != t.Size() {
		return fmt.Errorf("tensor %q: wrote %d bytes, declared %d (dtype %s, shape %v)", t.Name, cw.n, t.Size(), t.DType, t.Shape)
	}
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteFile writes a safetensors file atomically: to a temporary name in the same directory,
// synced, then renamed; on any error the temporary file is removed and path is untouched.
func WriteFile(path string, tensors []WriterTensor, metadata map[string]string) error {
	f, err := NewFileWriter(path, tensors, metadata)
	if err != nil {
		return err
	}
	if err := streamTensors(f, tensors, newStreamBuffer()); err != nil {
		f.Abort()
		return err
	}
	return f.Commit(metadata)
}

// newStreamBuffer makes the buffer streamTensors writes through: WriteTo implementations often
// write small pieces, and each piece reaching the FileWriter is a system call.
func newStreamBuffer() *bufio.Writer { return bufio.NewWriterSize(nil, 1<<20) }

// streamTensors writes tensors into f in file order, each through WriteTo and bw.
func streamTensors(f *FileWriter, tensors []WriterTensor, bw *bufio.Writer) error {
	for i, t := range tensors {
		bw.Reset(f.TensorWriter(i))
		if err := writeTensor(bw, t); err != nil {
			return fmt.Errorf("%s: %w", f.Path(), err)
		}
		if err := bw.Flush(); err != nil {
			return err // the FileWriter's errors name the file and tensor
		}
	}
	return nil
}

// ShardName is the Hugging Face shard file name, e.g. model-00001-of-00003.safetensors.
func ShardName(i, n int) string {
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n)
}

// SplitShards assigns tensors, in order, to shards of at most maxBytes of tensor data each (a
// larger tensor gets a shard of its own), as huggingface_hub does. maxBytes ≤ 0 means one shard.
func SplitShards(tensors []WriterTensor, maxBytes int64) [][]WriterTensor {
	var shards [][]WriterTensor
	var cur []WriterTensor
	var curBytes int64
	for _, t := range tensors {
		if maxBytes > 0 && len(cur) > 0 && curBytes+t.Size() > maxBytes {
			shards = append(shards, cur)
			cur, curBytes = nil, 0
		}
		cur = append(cur, t)
		curBytes += t.Size()
	}
	if len(cur) > 0 || len(shards) == 0 {
		shards = append(shards, cur)
	}
	return shards
}

// WriteCheckpoint writes tensors into dir as model.safetensors, or, when they exceed maxBytes,
// as numbered shards plus model.safetensors.index.json. It returns the file names written.
func WriteCheckpoint(dir string, tensors []WriterTensor, metadata map[string]string, maxBytes int64) ([]string, error) {
	return WriteShards(dir, SplitShards(tensors, maxBytes), metadata)
}

// WriteShards writes one file per group of tensors: model.safetensors when there is one
// group, else numbered shards and the index, which is written last so that a directory with
// an index is complete. It returns the file names written.
func WriteShards(dir string, shards [][]WriterTensor, metadata map[string]string) ([]string, error) {
	c, err := NewCheckpointWriter(dir, shards, metadata)
	if err != nil {
		return nil, err
	}
	bw := newStreamBuffer()
	for i, shard := range shards {
		if err := streamTensors(c.files[i], shard, bw); err != nil {
			c.Abort()
			return nil, err
		}
	}
	if err := c.Commit(metadata); err != nil {
		return nil, err
	}
	return c.Names(), nil
}
