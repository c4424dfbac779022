package safetensors

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// writeConcurrently calls write for 0..n-1, each in its own goroutine, started in random order.
func writeConcurrently(t *testing.T, r *rand.Rand, n int, write func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for _, i := range r.Perm(n) {
		wg.Go(func() { errs[i] = write(i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// writeInPieces streams data through w in pieces of chunk bytes.
func writeInPieces(w io.Writer, data []byte, chunk int) error {
	for len(data) > 0 {
		n := min(chunk, len(data))
		if _, err := w.Write(data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// dirNames lists dir; tests use it to check that nothing, temporary files included, is left.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func sameFile(t *testing.T, got, want string) {
	t.Helper()
	g, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g, w) {
		t.Errorf("%s (%d bytes) differs from %s (%d bytes)", got, len(g), want, len(w))
	}
}

// writeAllTensors fills f with data, half the tensors whole and half streamed in small pieces.
func writeAllTensors(t *testing.T, r *rand.Rand, f *FileWriter, ts []WriterTensor, data map[string][]byte) {
	t.Helper()
	writeConcurrently(t, r, len(ts), func(i int) error {
		b := data[ts[i].Name]
		if i%2 == 0 {
			return f.WriteTensor(i, b)
		}
		return writeInPieces(f.TensorWriter(i), b, 1+i%5)
	})
}

func TestFileWriterConcurrentMatchesWriteFile(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	ts, data := randomTensors(r)
	dir := t.TempDir()
	want := filepath.Join(dir, "want.safetensors")
	if err := WriteFile(want, ts, map[string]string{"k": "final-12"}); err != nil {
		t.Fatal(err)
	}
	got := filepath.Join(dir, "got.safetensors")
	f, err := NewFileWriter(got, ts, map[string]string{"k": "XXXXXXXX"}) // placeholder
	if err != nil {
		t.Fatal(err)
	}
	defer f.Abort()
	writeAllTensors(t, r, f, ts, data)
	if err := f.Commit(map[string]string{"k": "final-12"}); err != nil {
		t.Fatal(err)
	}
	sameFile(t, got, want)
	c, err := Open(got)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if m := c.Metadata(); m["k"] != "final-12" {
		t.Errorf("metadata %v", m)
	}
	for _, wt := range ts {
		if b, err := c.Bytes(wt.Name); err != nil || !bytes.Equal(b, data[wt.Name]) {
			t.Errorf("%s: bytes differ (%v)", wt.Name, err)
		}
	}
	if names := dirNames(t, dir); len(names) != 2 {
		t.Errorf("directory holds %v", names)
	}
}

// failedCommit checks that Commit fails with an error containing want and leaves dir empty.
func failedCommit(t *testing.T, f *FileWriter, meta map[string]string, want string) {
	t.Helper()
	err := f.Commit(meta)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), f.Path()) {
		t.Fatalf("Commit: want an error naming %s and %s, got %v", f.Path(), want, err)
	}
	if names := dirNames(t, filepath.Dir(f.Path())); len(names) != 0 {
		t.Errorf("failed commit left %v", names)
	}
}

func TestFileWriterCommitRejectsHeaderLengthChange(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	ts, data := randomTensors(r)
	f, err := NewFileWriter(filepath.Join(t.TempDir(), "x.safetensors"), ts, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	writeAllTensors(t, r, f, ts, data)
	failedCommit(t, f, map[string]string{"k": "a value long enough to outgrow the padding"}, "reserved")
}

func TestFileWriterCommitRejectsIncompleteTensor(t *testing.T) {
	ts := []WriterTensor{
		{Name: "a", DType: F32, Shape: []int{4}},
		{Name: "b", DType: F16, Shape: []int{8}},
		{Name: "c", DType: U8, Shape: []int{3}},
	}
	for _, tc := range []struct {
		name    string
		partial bool // write 3 of b's 16 bytes instead of none
	}{{"unwritten", false}, {"partly written", true}} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := NewFileWriter(filepath.Join(t.TempDir(), "x.safetensors"), ts, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.WriteTensor(0, make([]byte, 16)); err != nil {
				t.Fatal(err)
			}
			if err := f.WriteTensor(2, make([]byte, 3)); err != nil {
				t.Fatal(err)
			}
			if tc.partial {
				if _, err := f.TensorWriter(1).Write(make([]byte, 3)); err != nil {
					t.Fatal(err)
				}
			}
			failedCommit(t, f, nil, `tensor "b"`)
		})
	}
}

func TestFileWriterRejectsBadWrites(t *testing.T) {
	ts := []WriterTensor{
		{Name: "a", DType: F32, Shape: []int{4}},
		{Name: "b", DType: BF16, Shape: []int{2}},
		{Name: "empty", DType: F16, Shape: []int{0}},
	}
	f, err := NewFileWriter(filepath.Join(t.TempDir(), "x.safetensors"), ts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Abort()
	expect := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), f.Path()) {
			t.Errorf("%s: want an error naming %s and %s, got %v", what, f.Path(), want, err)
		}
	}
	expect("wrong length", f.WriteTensor(0, make([]byte, 15)), `tensor "a"`)
	if err := f.WriteTensor(0, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	expect("double write", f.WriteTensor(0, make([]byte, 16)), `tensor "a"`)
	if err := f.WriteTensor(2, nil); err != nil {
		t.Fatal(err)
	}
	expect("double write of an empty tensor", f.WriteTensor(2, nil), `tensor "empty"`)
	w := f.TensorWriter(1)
	if _, err := w.Write(make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
	_, err = w.Write(make([]byte, 2))
	expect("write past the end", err, `tensor "b"`)
	expect("whole write after a partial one", f.WriteTensor(1, make([]byte, 4)), `tensor "b"`)
	expect("index out of range", f.WriteTensor(3, nil), "out of range")
	_, err = f.TensorWriter(-1).Write([]byte{1})
	expect("negative index", err, "out of range")
	if _, err := w.Write(make([]byte, 1)); err != nil { // the failed writes claimed nothing
		t.Fatal(err)
	}
	if err := f.Commit(nil); err != nil {
		t.Fatal(err)
	}
	_, err = w.Write(nil)
	expect("write after Commit", err, "committed")
}

func TestWriteFileRejectsOverlongTensor(t *testing.T) {
	long := WriterTensor{Name: "a", DType: F32, Shape: []int{4}, WriteTo: func(w io.Writer) error {
		_, err := w.Write(make([]byte, 20))
		return err
	}}
	dir := t.TempDir()
	err := WriteFile(filepath.Join(dir, "x.safetensors"), []WriterTensor{long}, nil)
	if err == nil || !strings.Contains(err.Error(), `tensor "a": wrote 20 bytes, declared 16`) {
		t.Fatalf("got %v", err)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("failed write left %v", names)
	}
}

func TestFileWriterAbort(t *testing.T) {
	ts := []WriterTensor{{Name: "a", DType: U8, Shape: []int{2}}}
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	f, err := NewFileWriter(path, ts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.WriteTensor(0, []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	f.Abort()
	f.Abort()
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("Abort left %v", names)
	}
	if err := f.Commit(nil); err == nil {
		t.Error("Commit after Abort succeeded")
	}

	f, err = NewFileWriter(path, ts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.WriteTensor(0, []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := f.Commit(nil); err != nil {
		t.Fatal(err)
	}
	f.Abort()
	if names := dirNames(t, dir); !slices.Equal(names, []string{"x.safetensors"}) {
		t.Errorf("Abort after Commit: directory holds %v", names)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("committed file: %v, %v", st, err)
	}
}

func TestCheckpointWriterMatchesWriteShards(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	ts, data := randomTensors(r)
	shards := [][]WriterTensor{ts[:5], ts[5:14], ts[14:]}
	meta := map[string]string{"k": "v"}
	want, got := t.TempDir(), t.TempDir()
	names, err := WriteShards(want, shards, meta)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCheckpointWriter(got, shards, meta)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Abort()
	if !slices.Equal(c.Names(), names) || len(names) != 4 {
		t.Fatalf("Names %v, WriteShards wrote %v", c.Names(), names)
	}
	writeConcurrently(t, r, len(ts), func(i int) error {
		if i%2 == 0 {
			return c.Write(ts[i].Name, data[ts[i].Name])
		}
		w, err := c.Writer(ts[i].Name)
		if err != nil {
			return err
		}
		return writeInPieces(w, data[ts[i].Name], 3)
	})
	if err := c.Write("nope", nil); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("Write of an unknown tensor: %v", err)
	}
	if _, err := c.Writer("nope"); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("Writer of an unknown tensor: %v", err)
	}
	if err := c.Commit(meta); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dirNames(t, got), dirNames(t, want)) {
		t.Fatalf("wrote %v, WriteShards wrote %v", dirNames(t, got), dirNames(t, want))
	}
	for _, name := range names {
		sameFile(t, filepath.Join(got, name), filepath.Join(want, name))
	}
}

func TestCheckpointWriterNamesAndDuplicates(t *testing.T) {
	a := WriterTensor{Name: "a", DType: U8, Shape: []int{1}}
	b := WriterTensor{Name: "b", DType: U8, Shape: []int{1}}
	dir := t.TempDir()
	c, err := NewCheckpointWriter(dir, [][]WriterTensor{{a, b}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Names(), []string{"model.safetensors"}) {
		t.Errorf("one shard: Names %v", c.Names())
	}
	c.Abort()
	if _, err := NewCheckpointWriter(dir, [][]WriterTensor{{a}, {b, a}}, nil); err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("duplicate across shards: %v", err)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("directory holds %v", names)
	}
}
