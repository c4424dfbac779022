package convert

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/safetensors"
)

// runUnits runs `workers` units at once (the first three meet at a barrier, which they pass
// only together), starts them in order, runs each once, and after a failure starts no more and
// returns the first failure.
func TestRunUnitsConcurrencyAndOrder(t *testing.T) {
	const workers, count = 3, 30
	var running, maxRunning atomic.Int64
	var mu sync.Mutex
	var order []int
	arrived := make(chan struct{}, workers)
	units := make([]unit, count)
	for i := range units {
		units[i] = func(tensorSink) error {
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			n := running.Add(1)
			defer running.Add(-1)
			for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
			}
			if i < workers {
				arrived <- struct{}{}
				deadline := time.After(10 * time.Second)
				for len(arrived) < workers {
					select {
					case <-deadline:
						return fmt.Errorf("unit %d: the first %d units did not run at once", i, workers)
					case <-time.After(time.Millisecond):
					}
				}
			}
			time.Sleep(time.Millisecond)
			if i == 20 || i == 21 {
				return fmt.Errorf("unit %d failed", i)
			}
			return nil
		}
	}
	err := runUnits(nil, units, workers)
	if err == nil || err.Error() != "unit 20 failed" {
		t.Errorf("got %v, want unit 20's failure", err)
	}
	if m := maxRunning.Load(); m != workers {
		t.Errorf("at most %d units ran at once, want %d", m, workers)
	}
	for i, u := range order {
		if i >= 3 && u != i { // the first three race for the log
			t.Errorf("unit %d started %dth", u, i)
		}
	}
	if n := len(order); n < 21 || n > 21+workers {
		t.Errorf("%d units started; after unit 20 failed at most %d more may start", n, workers)
	}
	var ran atomic.Int64
	few := make([]unit, 5)
	for i := range few {
		few[i] = func(tensorSink) error { ran.Add(1); return nil }
	}
	if err := runUnits(nil, few, 8); err != nil || ran.Load() != 5 {
		t.Errorf("more workers than units: %v, %d of 5 ran", err, ran.Load())
	}
}

// The output is the same bytes whether one unit runs at a time or several, flushed to disk or
// not; the log has whole lines and the breakdown is filled.
func TestConvertWorkersMatch(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	dir := t.TempDir()
	for _, format := range []string{"gptq", "qpack"} {
		var outputs [3][]byte
		for i, workers := range []int{1, 4, 3} {
			testWorkers = workers
			opt := DefaultOptions()
			opt.Sync = i == 2
			opt.Format = format
			opt.Device = DeviceCPU
			var log bytes.Buffer
			opt.Log = &log
			dst := filepath.Join(dir, fmt.Sprintf("%s-%d", format, workers))
			r, err := Convert(tiny, dst, opt)
			testWorkers = 0
			if err != nil {
				t.Fatalf("%s, %d workers: %v", format, workers, err)
			}
			if outputs[i], err = os.ReadFile(filepath.Join(dst, "model.safetensors")); err != nil {
				t.Fatal(err)
			}
			checkLog(t, log.String(), r.Quantized)
			checkBreakdown(t, r)
		}
		if !bytes.Equal(outputs[0], outputs[1]) || !bytes.Equal(outputs[0], outputs[2]) {
			t.Errorf("%s: output differs between 1 worker, 4 workers and 3 synced", format)
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

// A module that fails while others run fails the conversion with its name and leaves no
// output behind.
func TestConvertUnitFailure(t *testing.T) {
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
	testWorkers = 4
	_, err := Convert(src, filepath.Join(dir, "out"), opt)
	testWorkers = 0
	if err == nil || !strings.Contains(err.Error(), "model.layers.5.mlp.up_proj.weight") {
		t.Fatalf("want an error naming the tensor, got %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("leftovers after a failed conversion: %v", entries)
	}
}

// Shards advance together by their share of bytes; each shard keeps its own order.
func TestInterleaveShards(t *testing.T) {
	var got []int
	var units []unit
	for i := range 7 {
		units = append(units, func(tensorSink) error { got = append(got, i); return nil })
	}
	// shard 0: units 0,1,2,3 of 10 bytes each; shard 1: units 4,5 (20 each); shard 2: unit 6
	shard := []int{0, 0, 0, 0, 1, 1, 2}
	bytes := []int64{10, 10, 10, 10, 20, 20, 5}
	if err := runUnits(nil, interleaveShards(units, shard, bytes), 1); err != nil {
		t.Fatal(err)
	}
	// places: 0, .25, .5, .75 | 0, .5 | 0
	want := []int{0, 4, 6, 1, 2, 5, 3}
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

// TestCalibrationOrder: a calibrating run's units go block by block, kept tensors first, the
// linears in the order the calibration solves them, the embedding first and the rest last.
func TestCalibrationOrder(t *testing.T) {
	names := []string{ // the checkpoint's order
		"lm_head.weight",
		"model.embed_tokens.weight",
		"model.layers.0.input_layernorm.weight",
		"model.layers.0.mlp.down_proj.weight",
		"model.layers.0.mlp.gate_proj.weight",
		"model.layers.0.mlp.up_proj.weight",
		"model.layers.0.post_attention_layernorm.weight",
		"model.layers.0.self_attn.k_proj.weight",
		"model.layers.0.self_attn.o_proj.weight",
		"model.layers.0.self_attn.q_proj.weight",
		"model.layers.0.self_attn.v_proj.weight",
		"model.layers.1.mlp.experts.0.down_proj.weight",
		"model.layers.1.mlp.experts.0.gate_proj.weight",
		"model.layers.1.mlp.experts.1.gate_proj.weight",
		"model.layers.1.mlp.gate.weight",
		"model.layers.1.self_attn.q_proj.weight",
		"model.layers.10.self_attn.q_proj.weight",
		"model.norm.weight",
	}
	var got []string
	units := make([]unit, len(names))
	for i, name := range names {
		units[i] = func(tensorSink) error { got = append(got, name); return nil }
	}
	if err := runUnits(nil, calibrationOrder(units, names), 1); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"model.embed_tokens.weight",
		"model.layers.0.input_layernorm.weight",
		"model.layers.0.post_attention_layernorm.weight",
		"model.layers.0.self_attn.q_proj.weight",
		"model.layers.0.self_attn.k_proj.weight",
		"model.layers.0.self_attn.v_proj.weight",
		"model.layers.0.self_attn.o_proj.weight",
		"model.layers.0.mlp.gate_proj.weight",
		"model.layers.0.mlp.up_proj.weight",
		"model.layers.0.mlp.down_proj.weight",
		"model.layers.1.mlp.gate.weight",
		"model.layers.1.self_attn.q_proj.weight",
		"model.layers.1.mlp.experts.0.gate_proj.weight",
		"model.layers.1.mlp.experts.1.gate_proj.weight",
		"model.layers.1.mlp.experts.0.down_proj.weight",
		"model.layers.10.self_attn.q_proj.weight",
		"lm_head.weight",
		"model.norm.weight",
	}
	if !slices.Equal(got, want) {
		t.Errorf("order\n%v\nwant\n%v", got, want)
	}
}
