// Package testenv locates the test fixtures: the repository's testdata and the optional
// shared directory of larger models beside the checkout.
package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Root returns the repository root (the directory holding go.mod).
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Testdata returns the path of rel inside the repository's testdata directory.
func Testdata(t testing.TB, rel string) string {
	return filepath.Join(Root(t), "testdata", rel)
}

// Shared returns the path of rel inside the shared directory ($QPACK_SHARED, or ../shared
// beside the checkout), and skips the test when it is absent: a fresh clone has no shared/.
func Shared(t testing.TB, rel string) string {
	t.Helper()
	base := os.Getenv("QPACK_SHARED")
	if base == "" {
		base = filepath.Join(Root(t), "..", "shared")
	}
	p := filepath.Join(base, rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared fixture %s not present", p)
	}
	return p
}

// StagingHasShard reports whether a hidden staging directory in parent holds a shard being
// written (its temporary file): the moment to kill a conversion in a test.
func StagingHasShard(parent string) bool {
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".") {
			continue
		}
		files, _ := os.ReadDir(filepath.Join(parent, e.Name()))
		for _, f := range files {
			if strings.Contains(f.Name(), ".safetensors.tmp-") {
				return true
			}
		}
	}
	return false
}
