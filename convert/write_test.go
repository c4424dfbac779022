package convert

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/safetensors"
)

// The scheduler runs `workers` tasks at once (the first three meet at a barrier, which they
// pass only together), never has more than `window` started and unconsumed, and hands every
// result, errors included, to a consumer that takes them in order.
func TestAheadConcurrencyAndWindow(t *testing.T) {
	const workers, window, count = 3, 5, 30
	var running, maxRunning, started, consumed atomic.Int64
	arrived := make(chan struct{}, workers)
	tasks := make([]*aheadTask, count)
	for i := range tasks {
		tasks[i] = newAheadTask(func() error {
			n := running.Add(1)
			defer running.Add(-1)
			for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
			}
			if s := started.Add(1); s-consumed.Load() > window {
				return fmt.Errorf("task %d started with %d unconsumed", i, s-1-consumed.Load())
			}
			if i < workers {
				arrived <- struct{}{}
				deadline := time.After(10 * time.Second)
				for len(arrived) < workers {
					select {
					case <-deadline:
						return fmt.Errorf("task %d: the first %d tasks did not run at once", i, workers)
					case <-time.After(time.Millisecond):
					}
				}
			}
			time.Sleep(time.Millisecond)
			if i%7 == 6 {
				return fmt.Errorf("task %d failed", i)
			}
			return nil
		})
	}
	a := newAhead(workers, window)
	a.start(tasks)
	defer a.close()
	for i, task := range tasks {
		err := task.wait()
		if want := i%7 == 6; (err != nil) != want || (want && err.Error() != fmt.Sprintf("task %d failed", i)) {
			t.Errorf("task %d: %v", i, err)
		}
		consumed.Add(1)
		a.done()
	}
	if m := maxRunning.Load(); m != workers {
		t.Errorf("at most %d tasks ran at once, want %d", m, workers)
	}
}

// close stops starting tasks and returns only after the running ones finished.
func TestAheadCloseWaitsForRunningTasks(t *testing.T) {
	var finished, started atomic.Int64
	release := make(chan struct{})
	var tasks []*aheadTask
	for range 10 {
		tasks = append(tasks, newAheadTask(func() error {
			started.Add(1)
			<-release
			time.Sleep(20 * time.Millisecond)
			finished.Add(1)
			return nil
		}))
	}
	a := newAhead(2, 2)
	a.start(tasks)
	for started.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	a.close() // nothing consumed: the window keeps the other 8 from starting
	if s, f := started.Load(), finished.Load(); s != 2 || f != 2 {
		t.Errorf("after close: %d started, %d finished; want 2 and 2", s, f)
	}
}

// Running the modules ahead of the writer (forced on the CPU here) writes the same bytes as
// running them on demand, logs whole lines, and fills the breakdown.
func TestConvertAheadMatchesOnDemand(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	dir := t.TempDir()
	for _, format := range []string{"gptq", "qpack"} {
		var outputs [2][]byte
		for i, aheadOn := range []bool{false, true} {
			runAheadOnCPU = aheadOn
			opt := DefaultOptions()
			opt.Format = format
			opt.Device = DeviceCPU // the CPU modules are what runAheadOnCPU moves ahead
			var log bytes.Buffer
			opt.Log = &log
			dst := filepath.Join(dir, fmt.Sprintf("%s-%v", format, aheadOn))
			r, err := Convert(tiny, dst, opt)
			runAheadOnCPU = false
			if err != nil {
				t.Fatalf("%s ahead=%v: %v", format, aheadOn, err)
			}
			if outputs[i], err = os.ReadFile(filepath.Join(dst, "model.safetensors")); err != nil {
				t.Fatal(err)
			}
			checkLog(t, log.String(), r.Quantized)
			checkBreakdown(t, r)
		}
		if !bytes.Equal(outputs[0], outputs[1]) {
			t.Errorf("%s: output differs when modules run ahead of the writer", format)
		}
	}
}

// checkLog wants one whole progress line per quantized tensor and the breakdown line last.
func checkLog(t *testing.T, log string, quantized int) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	progress := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "[") {
			progress++
			if !strings.HasSuffix(l, "ms") || strings.Count(l, "[") != 1 {
				t.Errorf("mangled progress line %q", l)
			}
		}
	}
	if progress != quantized {
		t.Errorf("%d progress lines for %d quantized tensors:\n%s", progress, quantized, log)
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "time: ") || !strings.Contains(last, "wall ") {
		t.Errorf("last log line %q is not the breakdown", last)
	}
}

func checkBreakdown(t *testing.T, r *Report) {
	t.Helper()
	byName := map[string]Phase{}
	for _, p := range r.Breakdown {
		byName[p.Name] = p
	}
	inputs, _ := os.Stat(filepath.Join(r.Source, "model.safetensors"))
	for _, c := range []struct {
		name  string
		bytes int64
	}{{"cpu read+quantize+pack", -1}, {"write", r.OutBytes}, {"hash", inputs.Size()}, {"wall", r.InBytes}} {
		p, ok := byName[c.name]
		if !ok {
			t.Errorf("breakdown has no %q: %+v", c.name, r.Breakdown)
			continue
		}
		if p.Seconds <= 0 || p.Bytes <= 0 || (c.bytes >= 0 && p.Bytes != c.bytes) || math.Abs(p.GBps-float64(p.Bytes)/p.Seconds/1e9) > 1e-9*p.GBps {
			t.Errorf("breakdown %q = %+v, want %d bytes and a rate", c.name, p, c.bytes)
		}
	}
	if p := byName["wall"]; p.Seconds != r.Seconds {
		t.Errorf("wall %v s, report says %v s", p.Seconds, r.Seconds)
	}
}

// A module that fails while running ahead fails the conversion with its name and leaves no
// output behind.
func TestConvertAheadFailure(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	bad := make([]byte, 4*128*128)
	binary.LittleEndian.PutUint32(bad[4*(5*128+7):], math.Float32bits(float32(math.Inf(1))))
	var ts []safetensors.WriterTensor
	for layer := range 8 {
		data := make([]byte, len(bad))
		if layer == 5 {
			data = bad
		}
		ts = append(ts, safetensors.BytesTensor(fmt.Sprintf("model.layers.%d.mlp.up_proj.weight", layer), safetensors.F32, []int{128, 128}, data))
	}
	if err := safetensors.WriteFile(filepath.Join(src, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	opt := DefaultOptions()
	opt.Format = "qpack"
	runAheadOnCPU = true
	_, err := Convert(src, filepath.Join(dir, "out"), opt)
	runAheadOnCPU = false
	if err == nil || !strings.Contains(err.Error(), "model.layers.5.mlp.up_proj.weight") {
		t.Fatalf("want an error naming the tensor, got %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("leftovers after a failed conversion: %v", entries)
	}
}
