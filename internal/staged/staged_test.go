package staged

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestDirAppearsOnlyWhenComplete(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "out")
	failure := errors.New("stop")
	err := Dir(dst, false, nil, func(dir string) error {
		if err := os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o666); err != nil {
			return err
		}
		return failure
	})
	if !errors.Is(err, failure) {
		t.Fatalf("got %v, want the write's error", err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(dst)); len(entries) != 0 {
		t.Fatalf("a failed write left %v", entries)
	}
	if err := Dir(dst, false, nil, func(dir string) error { return os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o666) }); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a")); err != nil || string(b) != "x" {
		t.Fatalf("output: %q, %v", b, err)
	}
	if err := Dir(dst, false, nil, func(string) error { return nil }); err == nil || !strings.Contains(err.Error(), "--overwrite") {
		t.Fatalf("an existing output without overwrite: %v", err)
	}
	if err := Dir(dst, true, nil, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dst, "a")); !os.IsNotExist(err) {
		t.Fatalf("overwrite kept the old output's file: %v", err)
	}
}

// TestPermissionsFollowUmask: outputs are readable by others under umask 022, as the files
// users write with other tools (os.CreateTemp's 0600 kept ollama's service user out).
func TestPermissionsFollowUmask(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	parent := t.TempDir()
	file := filepath.Join(parent, "model.gguf")
	if err := File(file, nil, true, func(f *os.File) error { _, err := f.WriteString("GGUF"); return err }); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "out")
	if err := Dir(dir, false, nil, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{file: 0o644, dir: 0o755 | os.ModeDir} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
		}
	}
}

func TestFileFailureLeavesNothing(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "model.gguf")
	err := File(dst, nil, true, func(f *os.File) error { f.WriteString("half"); return errors.New("disk full") })
	if err == nil {
		t.Fatal("no error")
	}
	if entries, _ := os.ReadDir(filepath.Dir(dst)); len(entries) != 0 {
		t.Fatalf("a failed write left %v", entries)
	}
}

// Clean removes the staging entries whose lock nobody holds — a directory's lock file, a staging
// file itself — and leaves entries still locked (another writer, here through another open file)
// and names without a lock.
func TestCleanRemovesOnlyAbandonedEntries(t *testing.T) {
	parent := t.TempDir()
	dst := filepath.Join(parent, "out")
	entry := func(tag string) string { return filepath.Join(parent, prefix(dst)+tag) }
	mkdir := func(p string, lock bool) {
		if err := os.MkdirAll(filepath.Join(p, "shard"), 0o755); err != nil {
			t.Fatal(err)
		}
		if lock {
			os.WriteFile(filepath.Join(p, lockName), nil, 0o644)
		}
	}
	dead, live, unlocked, deadFile := entry("dead"), entry("live"), entry("nolock"), entry("file")
	mkdir(dead, true)
	mkdir(live, true)
	mkdir(unlocked, false)
	os.WriteFile(deadFile, []byte("half a GGUF"), 0o644)
	holder, err := os.Open(filepath.Join(live, lockName))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := syscall.Flock(int(holder.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	if err := Dir(dst, false, &log, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{dead: false, deadFile: false, live: true, unlocked: true} {
		if _, err := os.Stat(p); (err == nil) != want {
			t.Errorf("%s: present %v, want %v", p, err == nil, want)
		}
	}
	if !strings.Contains(log.String(), "removed "+dead) || !strings.Contains(log.String(), "removed "+deadFile) {
		t.Errorf("log %q does not name the removed entries", log.String())
	}
	if _, err := os.Stat(filepath.Join(dst, lockName)); !os.IsNotExist(err) {
		t.Errorf("the output holds the staging lock file (%v)", err)
	}
}
