package gguf

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpen feeds arbitrary bytes to the reader: it must return an error or a file whose
// tensors all lie inside it, never panic or allocate by a lying count.
func FuzzOpen(f *testing.F) {
	dir := f.TempDir()
	seed := filepath.Join(dir, "seed.gguf")
	if err := Write(seed, allKVs(), []Tensor{constTensor("a", Q8_0, []uint64{32, 2}, make([]byte, 68))}); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(seed)
	f.Add(b)
	f.Add(b[:40])
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "f.gguf")
		os.WriteFile(path, data, 0o644)
		g, err := Open(path)
		if err != nil {
			return
		}
		defer g.Close()
		for _, ti := range g.Tensors {
			if g.DataOffset+ti.Offset+ti.Size > int64(len(data)) {
				t.Fatalf("tensor %s ends past the file", ti.Name)
			}
		}
	})
}
