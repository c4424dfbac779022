package gguf

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Stream takes tensors in any order from several goroutines and the header's final KVs at
// the end; the file reads back as if written in order.
func TestStreamAnyOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.gguf")
	var tensors []Tensor
	data := map[string][]byte{}
	for i := range 8 {
		name := "t" + string(rune('a'+i))
		b := bytes.Repeat([]byte{byte(i + 1)}, 4*(i+3))
		data[name] = b
		tensors = append(tensors, Tensor{Name: name, Type: F32, Dims: []uint64{uint64(i + 3)}})
	}
	kvs := []KV{{Key: "general.name", Value: "placeholder-000"}}
	err := Stream(path, kvs, tensors, nil, true, func(w *Writer) error {
		var wg sync.WaitGroup
		errs := make([]error, len(tensors))
		for i := len(tensors) - 1; i >= 0; i-- {
			wg.Go(func() { errs[i] = w.WriteTensor(tensors[i].Name, data[tensors[i].Name]) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		if err := w.SetKVs([]KV{{Key: "general.name", Value: "longer than the placeholder"}}); err == nil {
			t.Error("SetKVs took a header of another length")
		}
		return w.SetKVs([]KV{{Key: "general.name", Value: "final-value-123"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	g, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if v, _ := g.Get("general.name"); v != "final-value-123" {
		t.Errorf("general.name = %v", v)
	}
	for _, ti := range g.Tensors {
		b, err := g.Bytes(ti)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, data[ti.Name]) {
			t.Errorf("tensor %s reads back %v", ti.Name, b)
		}
	}
}

// A tensor left unwritten or written short fails the whole file: nothing is left behind.
func TestStreamIncomplete(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.gguf")
	tensors := []Tensor{{Name: "a", Type: F32, Dims: []uint64{4}}, {Name: "b", Type: F32, Dims: []uint64{4}}}
	err := Stream(path, nil, tensors, nil, true, func(w *Writer) error {
		if err := w.WriteTensor("a", make([]byte, 12)); err == nil {
			t.Error("a short tensor was taken")
		}
		if err := w.WriteTensor("c", make([]byte, 16)); err == nil {
			t.Error("a tensor not in the header was taken")
		}
		tw, _ := w.Tensor("b")
		if _, err := tw.Write(make([]byte, 20)); err == nil {
			t.Error("a stream past the tensor's end was taken")
		}
		return w.WriteTensor("a", make([]byte, 16))
	})
	if err == nil || !strings.Contains(err.Error(), "tensor b") {
		t.Fatalf("error %v, want one naming tensor b", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left %d entries behind", len(entries))
	}
}

// A tensor written in parts, out of order and concurrently, reads back whole; a part past the
// tensor's end is refused, and a missing part fails the file.
func TestStreamParts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.gguf")
	want := make([]byte, 4*12)
	for i := range want {
		want[i] = byte(i + 1)
	}
	tensors := []Tensor{{Name: "merged", Type: F32, Dims: []uint64{4, 3}}}
	err := Stream(path, nil, tensors, nil, true, func(w *Writer) error {
		if err := w.WritePart("merged", 40, make([]byte, 16)); err == nil {
			t.Error("a part past the end was taken")
		}
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for p := range 3 {
			wg.Go(func() { errs[p] = w.WritePart("merged", int64(16*(2-p)), want[16*(2-p):16*(3-p)]) })
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	g, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if b, _ := g.Bytes(g.Tensors[0]); !bytes.Equal(b, want) {
		t.Errorf("reads back %v", b)
	}
	err = Stream(path+"2", nil, tensors, nil, true, func(w *Writer) error { return w.WritePart("merged", 0, want[:32]) })
	if err == nil || !strings.Contains(err.Error(), "wrote 32 bytes") {
		t.Errorf("a missing part: error %v", err)
	}
}
