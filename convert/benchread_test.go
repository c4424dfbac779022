package convert

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/qpack-dev/qpack/internal/synth"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/safetensors"
)

// Both reads account for exactly the bytes they should: every tensor's data, or every file
// whole; sharded checkpoints included.
func TestReadBench(t *testing.T) {
	sharded := filepath.Join(t.TempDir(), "sharded")
	cfg := synth.Config{Layers: 3, Hidden: 64, Intermediate: 96, Heads: 4, KVHeads: 2, Vocab: 100, MaxShard: 40_000, Seed: 7}
	if err := synth.Write(sharded, cfg); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{testenv.Testdata(t, "models/tiny"), sharded} {
		ck, err := safetensors.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		var tensorBytes, fileBytes int64
		for _, name := range ck.Names() {
			info, _ := ck.Info(name)
			tensorBytes += info.Size
		}
		for _, p := range ck.Files() {
			st, _ := os.Stat(p)
			fileBytes += st.Size()
		}
		ck.Close()
		for _, workers := range []int{0, 1, 4} {
			r, err := ReadTensors(src, workers)
			if err != nil || r.Bytes != tensorBytes || r.Seconds <= 0 {
				t.Errorf("%s: ReadTensors(%d) = %v, %v; want %d bytes", src, workers, r, err, tensorBytes)
			}
		}
		r, err := ReadFiles(src)
		if err != nil || r.Bytes != fileBytes || r.Seconds <= 0 {
			t.Errorf("%s: ReadFiles = %v, %v; want %d bytes", src, r, err, fileBytes)
		}
	}
	if _, err := ReadTensors(filepath.Join(t.TempDir(), "missing"), 0); err == nil {
		t.Errorf("ReadTensors of a missing checkpoint: no error")
	}
	if _, err := ReadFiles(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Errorf("ReadFiles of a missing checkpoint: no error")
	}
}
