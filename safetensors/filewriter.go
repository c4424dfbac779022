package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// FileWriter writes one safetensors file whose tensors may arrive in any order and from several
// goroutines at once: the header fixes every tensor's offset before any data, so each tensor
// goes straight to its place in a pre-sized temporary file. Commit writes the header and moves
// the file into place atomically; until then path is untouched.
type FileWriter struct {
	// Sync makes Commit flush the file to disk before the rename, so that it survives a power
	// loss; each tensor's writeback is then started as soon as it is complete, so that the final
	// flush has little left. Without it (the default, as other checkpoint writers do) the file
	// still appears only when complete, but a power loss soon after could leave it with missing
	// data. Set it before the first write.
	Sync bool

	path      string
	tensors   []WriterTensor // descriptions only, to re-encode the header at Commit
	headerLen int
	tmp       *os.File

	mu     sync.Mutex
	slots  []slot
	err    error // first failed write: Commit must not publish a file with a hole in it
	closed bool  // committed or aborted
}

// slot is one tensor's place in the file and how much of it has been claimed by writers.
type slot struct {
	off, size int64
	written   int64
	started   bool // a write has been claimed, even of zero bytes
}

// NewFileWriter creates the temporary file for path, sized to hold the header and all tensor
// data. The tensors' WriteTo fields are ignored. The header is written by Commit, which lets
// callers replace metadata placeholders by final values of the same length.
func NewFileWriter(path string, tensors []WriterTensor, metadata map[string]string) (*FileWriter, error) {
	header, err := EncodeHeader(tensors, metadata)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f := &FileWriter{path: path, tensors: append([]WriterTensor(nil), tensors...), headerLen: len(header)}
	off := int64(len(header))
	for _, t := range tensors {
		f.slots = append(f.slots, slot{off: off, size: t.Size()})
		off += t.Size()
	}
	if f.tmp, err = createTemp(path); err != nil {
		return nil, err
	}
	// Sizing the file up front makes a WriteAt anywhere valid, in any order.
	if err := f.tmp.Truncate(off); err != nil {
		f.discard()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Path is the final path the file is committed to.
func (f *FileWriter) Path() string { return f.path }

// WriteTensor writes all of tensor i's bytes. Calls for different tensors may run concurrently.
func (f *FileWriter) WriteTensor(i int, data []byte) error {
	return f.write(i, data, true)
}

// TensorWriter streams tensor i in pieces, written one after another from its start; the
// tensor counts as written once its size has been reached. Use one goroutine per writer.
func (f *FileWriter) TensorWriter(i int) io.Writer {
	return tensorWriter{f, i}
}

type tensorWriter struct {
	f *FileWriter
	i int
}

func (w tensorWriter) Write(p []byte) (int, error) {
	if err := w.f.write(w.i, p, false); err != nil {
		return 0, err
	}
	return len(p), nil
}

// write is the one path for tensor data: claim the next range of tensor i under the lock,
// write it outside the lock so that tensors are written in parallel, and once the tensor is
// complete ask the OS to start writing it back.
func (f *FileWriter) write(i int, p []byte, whole bool) error {
	off, done, err := f.claim(i, int64(len(p)), whole)
	if err != nil {
		return err
	}
	if _, err := f.tmp.WriteAt(p, off); err != nil {
		err = fmt.Errorf("%s: tensor %q: %w", f.path, f.tensors[i].Name, err)
		f.fail(err)
		return err
	}
	if s := f.slots[i]; f.Sync && done && s.size > 0 { // slot offsets and sizes never change
		startWriteback(f.tmp, s.off, s.size)
	}
	return nil
}

// claim reserves n bytes of tensor i and returns their file offset and whether they complete
// the tensor. whole asks for the entire tensor, which must not have been started.
func (f *FileWriter) claim(i int, n int64, whole bool) (off int64, done bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < 0 || i >= len(f.slots) {
		return 0, false, fmt.Errorf("%s: tensor index %d out of range (%d tensors)", f.path, i, len(f.slots))
	}
	t, s := f.tensors[i], &f.slots[i]
	switch {
	case f.closed:
		return 0, false, fmt.Errorf("%s: tensor %q: writer already committed or aborted", f.path, t.Name)
	case whole && s.started:
		return 0, false, fmt.Errorf("%s: tensor %q: already written", f.path, t.Name)
	case whole && n != s.size:
		return 0, false, fmt.Errorf("%s: tensor %q: got %d bytes, declared %d (dtype %s, shape %v)", f.path, t.Name, n, s.size, t.DType, t.Shape)
	case s.written+n > s.size:
		return 0, false, fmt.Errorf("%s: tensor %q: writing %d bytes at %d runs past its %d bytes", f.path, t.Name, n, s.written, s.size)
	}
	off = s.off + s.written
	s.written += n
	s.started = true
	return off, n > 0 && s.written == s.size, nil
}

// fail records the first write error.
func (f *FileWriter) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

// Commit writes the header, re-encoded with metadata, and publishes the file at Path. The
// header must keep the length reserved at creation, since the data offsets depend on it, and
// every tensor must be complete. Call it after all writes have returned. On any error the
// temporary file is removed and Path is untouched.
func (f *FileWriter) Commit(metadata map[string]string) error {
	if !f.close() {
		return fmt.Errorf("%s: writer already committed or aborted", f.path)
	}
	err := f.commit(metadata)
	if err != nil {
		f.discard()
	}
	return err
}

func (f *FileWriter) commit(metadata map[string]string) error {
	header, err := EncodeHeader(f.tensors, metadata)
	if err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	if len(header) != f.headerLen {
		return fmt.Errorf("%s: header with the final metadata is %d bytes, %d were reserved", f.path, len(header), f.headerLen)
	}
	if err := f.complete(); err != nil {
		return err
	}
	if _, err := f.tmp.WriteAt(header, 0); err != nil {
		return fmt.Errorf("%s: writing header: %w", f.path, err)
	}
	if err := publish(f.tmp, f.path, f.Sync); err != nil {
		return fmt.Errorf("%s: %w", f.path, err)
	}
	return nil
}

// complete reports the first failed write, else the first tensor not completely written.
func (f *FileWriter) complete() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	for i, s := range f.slots {
		if s.written != s.size {
			return fmt.Errorf("%s: tensor %q: incomplete, %d of %d bytes written", f.path, f.tensors[i].Name, s.written, s.size)
		}
	}
	return nil
}

// Abort removes the temporary file. It does nothing after Commit or a previous Abort, so it
// can be deferred right after NewFileWriter.
func (f *FileWriter) Abort() {
	if f.close() {
		f.discard()
	}
}

// close marks the writer finished, refusing further writes; it reports whether this call did.
func (f *FileWriter) close() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.closed = true
	return true
}

func (f *FileWriter) discard() {
	f.tmp.Close()
	os.Remove(f.tmp.Name())
}

// createTemp opens a temporary file next to path, so that the final rename stays within one
// file system and is atomic.
func createTemp(path string) (*os.File, error) {
	return os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
}

// publish renames tmp to path, so that path is either absent or complete; with sync it first
// flushes tmp to disk, so that this holds after a power loss too. CreateTemp makes files 0600; checkpoints are meant to be shared. The
// caller removes tmp on error.
func publish(tmp *os.File, path string, sync bool) error {
	if sync {
		if err := tmp.Sync(); err != nil {
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// writeAtomic writes small files (the index) with the same temporary-file-and-rename path.
func writeAtomic(path string, data []byte, sync bool) error {
	tmp, err := createTemp(path)
	if err != nil {
		return err
	}
	if _, err = tmp.Write(data); err == nil {
		err = publish(tmp, path, sync)
	}
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// CheckpointWriter writes a checkpoint's shards through one FileWriter each, so that tensors
// can be written by name, in any order, from several goroutines.
type CheckpointWriter struct {
	dir    string
	shards [][]WriterTensor
	files  []*FileWriter
	where  map[string]tensorLoc
	sync   bool // see SetSync
}

type tensorLoc struct{ shard, index int }

// NewCheckpointWriter creates one FileWriter per shard in dir: model.safetensors for a single
// shard, else numbered shards, with the index written at Commit.
func NewCheckpointWriter(dir string, shards [][]WriterTensor, metadata map[string]string) (*CheckpointWriter, error) {
	c := &CheckpointWriter{dir: dir, shards: shards, where: map[string]tensorLoc{}}
	for s, shard := range shards {
		for i, t := range shard {
			if prev, dup := c.where[t.Name]; dup && prev.shard != s {
				return nil, fmt.Errorf("%s: tensor %q is in both %s and %s", dir, t.Name, c.fileName(prev.shard), c.fileName(s))
			}
			c.where[t.Name] = tensorLoc{s, i} // duplicates within a shard: EncodeHeader rejects them
		}
	}
	for s, shard := range shards {
		f, err := NewFileWriter(filepath.Join(dir, c.fileName(s)), shard, metadata)
		if err != nil {
			c.Abort()
			return nil, err
		}
		c.files = append(c.files, f)
	}
	return c, nil
}

func (c *CheckpointWriter) fileName(shard int) string {
	if len(c.shards) == 1 {
		return "model.safetensors"
	}
	return ShardName(shard, len(c.shards))
}

func (c *CheckpointWriter) sharded() bool { return len(c.shards) != 1 }

// Names returns the file names Commit writes, in order, with the index last when sharded.
func (c *CheckpointWriter) Names() []string {
	var names []string
	for s := range c.shards {
		names = append(names, c.fileName(s))
	}
	if c.sharded() {
		names = append(names, IndexName)
	}
	return names
}

// SetSync sets FileWriter.Sync on every shard, and makes Commit flush the index too. Call it
// before the first write.
func (c *CheckpointWriter) SetSync(sync bool) {
	c.sync = sync
	for _, f := range c.files {
		f.Sync = sync
	}
}

// Write writes all of the named tensor's bytes.
func (c *CheckpointWriter) Write(name string, data []byte) error {
	loc, err := c.find(name)
	if err != nil {
		return err
	}
	return c.files[loc.shard].WriteTensor(loc.index, data)
}

// Writer returns a writer that streams the named tensor in pieces.
func (c *CheckpointWriter) Writer(name string) (io.Writer, error) {
	loc, err := c.find(name)
	if err != nil {
		return nil, err
	}
	return c.files[loc.shard].TensorWriter(loc.index), nil
}

func (c *CheckpointWriter) find(name string) (tensorLoc, error) {
	loc, ok := c.where[name]
	if !ok {
		return tensorLoc{}, fmt.Errorf("%s: no tensor %q in this checkpoint", c.dir, name)
	}
	return loc, nil
}

// Commit commits every shard with metadata, concurrently since each ends in an fsync, then
// writes the index last, so that a directory with an index is complete. A shard whose commit
// fails removes its own temporary file, so nothing is left pending; shards already committed
// stay in place.
func (c *CheckpointWriter) Commit(metadata map[string]string) error {
	errs := make([]error, len(c.files))
	var wg sync.WaitGroup
	for i, f := range c.files {
		wg.Go(func() { errs[i] = f.Commit(metadata) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if !c.sharded() {
		return nil
	}
	index, err := c.index()
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(c.dir, IndexName), index, c.sync)
}

// index is the model.safetensors.index.json content: total data size and tensor → shard.
func (c *CheckpointWriter) index() ([]byte, error) {
	ix := Index{Metadata: map[string]any{}, WeightMap: map[string]string{}}
	var total int64
	for s, shard := range c.shards {
		for _, t := range shard {
			ix.WeightMap[t.Name] = c.fileName(s)
			total += t.Size()
		}
	}
	ix.Metadata["total_size"] = total
	b, err := json.MarshalIndent(ix, "", "  ")
	return append(b, '\n'), err
}

// Abort removes every shard's temporary file; committed shards are kept.
func (c *CheckpointWriter) Abort() {
	for _, f := range c.files {
		f.Abort()
	}
}
