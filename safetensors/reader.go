package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// ReadHeader reads and validates only the header of a safetensors file; it touches no tensor
// data, so it answers instantly on files of any size.
func ReadHeader(path string) (*Header, error) {
	f, h, _, err := openHeader(path)
	if err != nil {
		return nil, err
	}
	f.Close()
	return h, nil
}

// openHeader opens path and reads its header; the caller closes the file.
func openHeader(path string) (*os.File, *Header, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, 0, err
	}
	st, err := f.Stat()
	if err == nil {
		var h *Header
		if h, err = readHeader(f, path, st.Size()); err == nil {
			return f, h, st.Size(), nil
		}
	}
	f.Close()
	return nil, nil, 0, err
}

func readHeader(r io.ReaderAt, path string, fileSize int64) (*Header, error) {
	var prefix [8]byte
	if _, err := r.ReadAt(prefix[:], 0); err != nil {
		return nil, fmt.Errorf("%s: file too short for a safetensors header (%d bytes)", path, fileSize)
	}
	n := binary.LittleEndian.Uint64(prefix[:])
	if n > MaxHeaderSize {
		return nil, fmt.Errorf("%s: header length %d exceeds the limit of %d bytes", path, n, MaxHeaderSize)
	}
	if int64(n) > fileSize-8 {
		return nil, fmt.Errorf("%s: header length %d runs past the end of the %d-byte file", path, n, fileSize)
	}
	buf := make([]byte, n)
	if _, err := r.ReadAt(buf, 8); err != nil {
		return nil, fmt.Errorf("%s: reading header: %w", path, err)
	}
	return ParseHeader(path, buf, fileSize-8-int64(n))
}

// File is one memory-mapped safetensors file.
type File struct {
	Path   string
	Header *Header
	data   []byte   // the whole file, mapped read-only; nil when empty
	fd     *os.File // for ReadInto; nil when empty
	byName map[string]int
}

// OpenFile maps a safetensors file and validates its header.
func OpenFile(path string) (*File, error) {
	f, h, size, err := openHeader(path)
	if err != nil {
		return nil, err
	}
	sf := &File{Path: path, Header: h, byName: make(map[string]int, len(h.Tensors))}
	for i, t := range h.Tensors {
		sf.byName[t.Name] = i
	}
	if h.DataSize == 0 {
		f.Close()
		return sf, nil
	}
	sf.data, err = syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: mmap: %w", path, err)
	}
	sf.fd = f
	return sf, nil
}

// Close unmaps and closes the file; views returned by Bytes must not be used afterwards.
func (f *File) Close() error {
	if f.data == nil {
		return nil
	}
	err := syscall.Munmap(f.data)
	f.data = nil
	return errors.Join(err, f.fd.Close())
}

func (f *File) bytes(t TensorInfo) []byte {
	if t.Size == 0 {
		return []byte{}
	}
	return f.data[t.Offset : t.Offset+t.Size : t.Offset+t.Size]
}

// Checkpoint is a set of safetensors files read as one: a single file, or a directory with a
// model.safetensors.index.json and its shards (or plain *.safetensors files without index).
type Checkpoint struct {
	Dir   string
	files []*File
	where map[string]tensorRef
	names []string
	// virtual tensors read in place of stored ones, and names left out of Names (virtual.go)
	virtual map[string]Virtual
	hidden  map[string]bool
}

type tensorRef struct {
	file *File
	info TensorInfo
}

// IndexName is the file name of a sharded checkpoint's index.
const IndexName = "model.safetensors.index.json"

// Open opens a safetensors file or checkpoint directory.
func Open(path string) (*Checkpoint, error) {
	files, err := checkpointFiles(path)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Dir: path, where: map[string]tensorRef{}}
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		c.Dir = filepath.Dir(path)
	}
	for _, p := range files {
		f, err := OpenFile(p)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.files = append(c.files, f)
		for _, t := range f.Header.Tensors {
			if prev, dup := c.where[t.Name]; dup {
				c.Close()
				return nil, fmt.Errorf("tensor %q appears in both %s and %s", t.Name, prev.file.Path, p)
			}
			c.where[t.Name] = tensorRef{f, t}
			c.names = append(c.names, t.Name)
		}
	}
	sort.Strings(c.names)
	if idx := filepath.Join(c.Dir, IndexName); fileExists(idx) && isDir(path) {
		if err := c.checkIndex(idx); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// checkpointFiles lists the safetensors files that make up path.
func checkpointFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	if idx := filepath.Join(path, IndexName); fileExists(idx) {
		ix, err := ReadIndex(idx)
		if err != nil {
			return nil, err
		}
		var files []string
		for _, shard := range ix.Shards() {
			p := filepath.Join(path, shard)
			if !fileExists(p) {
				return nil, fmt.Errorf("%s names shard %s, which does not exist", idx, shard)
			}
			files = append(files, p)
		}
		return files, nil
	}
	files, _ := filepath.Glob(filepath.Join(path, "*.safetensors"))
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no *.safetensors files and no %s", path, IndexName)
	}
	sort.Strings(files)
	return files, nil
}

// checkIndex verifies that every tensor the index names is in the shard it names.
func (c *Checkpoint) checkIndex(path string) error {
	ix, err := ReadIndex(path)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(ix.WeightMap))
	for name := range ix.WeightMap {
		names = append(names, name)
	}
	sort.Strings(names) // report the same first problem on every run
	for _, name := range names {
		shard := ix.WeightMap[name]
		ref, ok := c.where[name]
		if !ok {
			return fmt.Errorf("%s: tensor %q is not in any shard (index says %s)", path, name, shard)
		}
		if filepath.Base(ref.file.Path) != shard {
			return fmt.Errorf("%s: tensor %q is in %s, not in %s as the index says", path, name, filepath.Base(ref.file.Path), shard)
		}
	}
	return nil
}

// Close unmaps every file.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// Files returns the paths of the files in the checkpoint, in index order.
func (c *Checkpoint) Files() []string {
	out := make([]string, len(c.files))
	for i, f := range c.files {
		out[i] = f.Path
	}
	return out
}

// Headers returns each file's header, in the order of Files.
func (c *Checkpoint) Headers() []*Header {
	out := make([]*Header, len(c.files))
	for i, f := range c.files {
		out[i] = f.Header
	}
	return out
}

// Names returns every tensor name, sorted.
func (c *Checkpoint) Names() []string { return c.names }

// Info describes the named tensor.
func (c *Checkpoint) Info(name string) (TensorInfo, bool) {
	if v, ok := c.virtual[name]; ok {
		return v.Info, true
	}
	r, ok := c.where[name]
	return r.info, ok
}

// Shape returns the named tensor's shape.
func (c *Checkpoint) Shape(name string) ([]int, bool) {
	info, ok := c.Info(name)
	return info.Shape, ok
}

// Metadata returns the __metadata__ of the first file (shards of one checkpoint share it).
func (c *Checkpoint) Metadata() map[string]string {
	if len(c.files) == 0 {
		return map[string]string{}
	}
	return c.files[0].Header.Metadata
}

// Bytes returns a read-only, zero-copy view of the named tensor's raw little-endian bytes,
// valid until Close (a virtual tensor's bytes are read into a new buffer).
func (c *Checkpoint) Bytes(name string) ([]byte, error) {
	if v, ok := c.virtual[name]; ok {
		return v.bytes()
	}
	r, ok := c.where[name]
	if !ok {
		return nil, fmt.Errorf("tensor %q not found in %s", name, c.Dir)
	}
	return r.file.bytes(r.info), nil
}

// ReadInto copies the named tensor's raw bytes into dst, which must be exactly its size, with
// read system calls rather than through the mapping: the kernel copies from the page cache
// without a page fault per few pages, which is faster for a copy that is read once (the GPU
// path's staging into pinned memory).
func (c *Checkpoint) ReadInto(name string, dst []byte) error {
	if v, ok := c.virtual[name]; ok {
		if int64(len(dst)) != v.Info.Size {
			return fmt.Errorf("tensor %q: destination holds %d bytes, tensor has %d", name, len(dst), v.Info.Size)
		}
		return v.Read(dst)
	}
	r, ok := c.where[name]
	if !ok {
		return fmt.Errorf("tensor %q not found in %s", name, c.Dir)
	}
	if int64(len(dst)) != r.info.Size {
		return fmt.Errorf("tensor %q: destination holds %d bytes, tensor has %d", name, len(dst), r.info.Size)
	}
	// One thread copies from the page cache at a few GB/s; large tensors are read in parts
	// at once, which together come closer to the memory bandwidth.
	parts := int(min(readParts, max(1, r.info.Size/readPartMin)))
	part := (r.info.Size + int64(parts) - 1) / int64(parts)
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for p := range parts {
		lo, hi := int64(p)*part, min(int64(p+1)*part, r.info.Size)
		wg.Go(func() {
			if _, err := r.file.fd.ReadAt(dst[lo:hi], r.info.Offset+lo); err != nil {
				errs[p] = fmt.Errorf("tensor %q in %s: %w", name, r.file.Path, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ReadInto splits a tensor into at most readParts reads of at least readPartMin bytes.
const (
	readParts   = 4
	readPartMin = 8 << 20
)

// Float32 returns the named tensor converted to a new float32 slice.
func (c *Checkpoint) Float32(name string) ([]float32, error) {
	info, ok := c.Info(name)
	if !ok {
		return nil, fmt.Errorf("tensor %q not found in %s", name, c.Dir)
	}
	return c.Float32Into(name, make([]float32, info.NumElements()))
}

// Float32Into converts the named tensor into dst, which must hold exactly its elements.
func (c *Checkpoint) Float32Into(name string, dst []float32) ([]float32, error) {
	if v, ok := c.virtual[name]; ok {
		b, err := v.bytes()
		if err == nil && int64(len(dst)) != v.Info.NumElements() {
			err = fmt.Errorf("tensor %q: destination holds %d elements, tensor has %d", name, len(dst), v.Info.NumElements())
		}
		if err == nil {
			err = DecodeFloat32(v.Info.DType, dst, b)
		}
		return dst, err
	}
	r, ok := c.where[name]
	if !ok {
		return nil, fmt.Errorf("tensor %q not found in %s", name, c.Dir)
	}
	if int64(len(dst)) != r.info.NumElements() {
		return nil, fmt.Errorf("tensor %q: destination holds %d elements, tensor has %d", name, len(dst), r.info.NumElements())
	}
	if err := DecodeFloat32(r.info.DType, dst, r.file.bytes(r.info)); err != nil {
		return nil, fmt.Errorf("tensor %q in %s: %w", name, r.file.Path, err)
	}
	return dst, nil
}

// Index is the content of model.safetensors.index.json.
type Index struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// ReadIndex parses and checks an index file.
func ReadIndex(path string) (*Index, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseIndex(path, b)
}

// ParseIndex parses an index file's content.
func ParseIndex(path string, b []byte) (*Index, error) {
	var ix Index
	if err := json.Unmarshal(b, &ix); err != nil {
		return nil, fmt.Errorf("%s: invalid index JSON: %w", path, err)
	}
	if len(ix.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: index has no weight_map entries", path)
	}
	for name, shard := range ix.WeightMap {
		if shard == "" || shard == "." || shard == ".." || strings.ContainsAny(shard, `/\`) {
			return nil, fmt.Errorf("%s: tensor %q maps to invalid shard name %q", path, name, shard)
		}
	}
	return &ix, nil
}

// Shards lists the distinct shard files of the index, sorted.
func (ix *Index) Shards() []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ix.WeightMap {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// Release tells the kernel that the named tensor's mapped pages are no longer needed by this
// process, so streaming through a checkpoint larger than memory does not grow the resident
// set; the data stays in the page cache and a later access maps it again.
func (c *Checkpoint) Release(name string) {
	r, ok := c.where[name]
	if !ok || r.file.data == nil || r.info.Size == 0 {
		return
	}
	page := int64(os.Getpagesize())
	start := r.info.Offset &^ (page - 1)
	end := min((r.info.Offset+r.info.Size+page-1)&^(page-1), int64(len(r.file.data)))
	syscall.Madvise(r.file.data[start:end], syscall.MADV_DONTNEED)
}
