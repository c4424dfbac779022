package convert

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/internal/synth"
	"github.com/qpack-dev/qpack/internal/testenv"
)

// A conversion killed mid-write (SIGKILL: no cleanup runs) leaves no output directory, only its
// hidden staging directory: nothing that looks like a finished checkpoint. The next conversion
// to that output removes the staging directory and says so.
func TestKillDuringWrite(t *testing.T) {
	if src := os.Getenv("QPACK_KILL_SRC"); src != "" { // the child: convert until killed
		opt := DefaultOptions()
		opt.Device = DeviceCPU
		if _, err := Convert(src, os.Getenv("QPACK_KILL_DST"), opt); err != nil {
			t.Fatal(err)
		}
		return
	}
	if testing.Short() {
		t.Skip("writes a 400 MB checkpoint")
	}
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "out", "dst")
	cfg := synth.Config{Layers: 24, Hidden: 1024, Intermediate: 2816, Heads: 8, KVHeads: 8, Vocab: 8000, MaxShard: 100e6}
	if err := synth.Write(src, cfg); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillDuringWrite$")
	cmd.Env = append(os.Environ(), "QPACK_KILL_SRC="+src, "QPACK_KILL_DST="+dst)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill while the staging directory holds shards being written (temporary files).
	deadline := time.Now().Add(60 * time.Second)
	for !testenv.StagingHasShard(filepath.Dir(dst)) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the conversion never started writing shards")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatalf("a killed conversion left %s behind (%v)", dst, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(dst))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			t.Errorf("visible leftover %s", e.Name())
		}
	}
	if len(entries) == 0 {
		t.Fatal("the killed conversion left no staging directory: the kill came too late to test the cleanup")
	}
	var log strings.Builder
	opt := DefaultOptions()
	opt.Log = &log
	if _, err := Convert(testenv.Testdata(t, "models/tiny"), dst, opt); err != nil {
		t.Fatal(err)
	}
	entries, _ = os.ReadDir(filepath.Dir(dst))
	if len(entries) != 1 || entries[0].Name() != "dst" {
		t.Errorf("after the next conversion %s holds %v, want only dst", filepath.Dir(dst), entries)
	}
	if !strings.Contains(log.String(), "left by a run that did not finish") {
		t.Errorf("the next conversion did not report the removed staging directory:\n%s", log.String())
	}
}
