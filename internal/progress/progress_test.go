package progress

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestLine(t *testing.T) {
	got := Line("convert", "tensors", 10, 40, 1_000_000_000, 4_000_000_000, 10*time.Second)
	want := "convert: 10/40 tensors (25%), 1.00 GB of 4.00 GB, 100 MB/s, 10s elapsed, ETA 30s"
	if got != want {
		t.Errorf("Line:\n got %q\nwant %q", got, want)
	}
	got = Line("batch", "jobs", 1, 3, 0, 0, 1500*time.Millisecond)
	want = "batch: 1/3 jobs (33%), 1.5s elapsed, ETA 3s"
	if got != want {
		t.Errorf("Line without bytes:\n got %q\nwant %q", got, want)
	}
	if got := Line("plan", "tensors", 3, 3, 0, 0, time.Second); strings.Contains(got, "ETA") {
		t.Errorf("a finished line has an ETA: %q", got)
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{999: "999 B", 1500: "1.50 kB", 42_000_000: "42.0 MB", 7_300_000_000: "7.30 GB", 650_000_000: "650 MB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// Not on a terminal: plain lines, at most one per Every unless another tenth is done, and the
// last one always.
func TestPlainLines(t *testing.T) {
	var buf bytes.Buffer
	m := New(&buf, "convert", "tensors")
	clock := time.Unix(0, 0)
	m.now, m.start = func() time.Time { return clock }, clock
	for i := 1; i <= 100; i++ {
		clock = clock.Add(100 * time.Millisecond) // 10 s in all: two Every periods
		m.Update(i, 100, 0, 0)
	}
	m.Finish()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	// One per tenth (10) plus the first; the time rule adds none at 100 ms steps.
	if len(lines) != 11 {
		t.Errorf("%d lines, want 11:\n%s", len(lines), buf.String())
	}
	if strings.Contains(buf.String(), "\r") {
		t.Error("a plain log holds a carriage return")
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "convert: 100/100 tensors (100%)") {
		t.Errorf("last line %q", last)
	}
}

// On a terminal one line is redrawn and Finish ends it.
func TestTerminalRedraw(t *testing.T) {
	var buf bytes.Buffer
	m := New(&buf, "batch", "jobs")
	m.tty = true
	clock := time.Unix(0, 0)
	m.now, m.start = func() time.Time { return clock }, clock
	for i := 1; i <= 3; i++ {
		clock = clock.Add(time.Second)
		m.Update(i, 3, 0, 0)
	}
	m.Finish()
	out := buf.String()
	if strings.Count(out, "\r\x1b[K") != 3 || strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "batch: 3/3 jobs (100%), 3s elapsed\n") {
		t.Errorf("terminal output %q", out)
	}
	buf.Reset()
	m.drawn, m.line = true, "batch: 2/3 jobs"
	fmt.Fprintln(m.Log(&buf), "job b: passed")
	if want := "\r\x1b[Kjob b: passed\nbatch: 2/3 jobs"; buf.String() != want {
		t.Errorf("a log line over the progress line: %q, want %q", buf.String(), want)
	}
	var nilMeter *Meter
	nilMeter.Update(1, 2, 3, 4) // a nil meter reports nothing and does not panic
	nilMeter.Finish()
}
