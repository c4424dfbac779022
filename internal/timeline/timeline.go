// Package timeline records what a run did when, and on which GPU, as named spans written in the
// Chrome trace-event format (qpack --trace FILE; chrome://tracing or ui.perfetto.dev show it):
// where the time of a conversion on several GPUs goes, step by step.
package timeline

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Host is the lane of work that belongs to no single GPU.
const Host = -1

// Recording collects the spans that end while it is the active one.
type Recording struct {
	start time.Time
	mu    sync.Mutex
	spans []span
}

type span struct {
	name       string
	lane       int
	start, end time.Duration // from the recording's start
}

var active atomic.Pointer[Recording]

// Start begins a recording, the active one until Stop.
func Start() *Recording {
	r := &Recording{start: time.Now()}
	active.Store(r)
	return r
}

// Stop ends the recording; spans that end later are dropped.
func (r *Recording) Stop() { active.CompareAndSwap(r, nil) }

// On says whether a recording is active (to skip building span names otherwise).
func On() bool { return active.Load() != nil }

// Begin starts a span on lane (a GPU's index, or Host) named by format and args, and returns
// what ends it. Without an active recording it does nothing and costs no formatting.
func Begin(lane int, format string, args ...any) (end func()) {
	r := active.Load()
	if r == nil {
		return func() {}
	}
	name := format
	if len(args) > 0 {
		name = fmt.Sprintf(format, args...)
	}
	start := time.Since(r.start)
	return func() { r.add(span{name, lane, start, time.Since(r.start)}) }
}

// Since records a span on lane named name from start until now (a span whose start was taken
// before it was known to be worth recording). Without an active recording it does nothing.
func Since(lane int, start time.Time, name string) {
	r := active.Load()
	if r == nil {
		return
	}
	r.add(span{name, lane, start.Sub(r.start), time.Since(r.start)})
}

func (r *Recording) add(s span) {
	r.mu.Lock()
	r.spans = append(r.spans, s)
	r.mu.Unlock()
}

// traceEvent is one complete ("X") event of the trace-event format; times in microseconds.
type traceEvent struct {
	Name  string  `json:"name"`
	Phase string  `json:"ph"`
	TS    float64 `json:"ts"`
	Dur   float64 `json:"dur"`
	PID   int     `json:"pid"`
	TID   int     `json:"tid"`
}

type metadataEvent struct {
	Name  string            `json:"name"`
	Phase string            `json:"ph"`
	PID   int               `json:"pid"`
	TID   int               `json:"tid"`
	Args  map[string]string `json:"args"`
}

// WriteFile writes the spans recorded so far to path as a trace-event JSON file, one thread per
// lane ("host", "GPU 0", …). It writes a temporary file and renames it into place.
func (r *Recording) WriteFile(path string) error {
	r.mu.Lock()
	spans := append([]span(nil), r.spans...)
	r.mu.Unlock()
	events := []any{}
	lanes := map[int]bool{}
	for _, s := range spans {
		if !lanes[s.lane] {
			lanes[s.lane] = true
			name := "host"
			if s.lane != Host {
				name = fmt.Sprintf("GPU %d", s.lane)
			}
			events = append(events, metadataEvent{"thread_name", "M", 1, tid(s.lane), map[string]string{"name": name}})
		}
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		events = append(events, traceEvent{s.name, "X", us(s.start), us(s.end - s.start), 1, tid(s.lane)})
	}
	data, err := json.Marshal(map[string]any{"traceEvents": events, "displayTimeUnit": "ms"})
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	return os.Rename(tmp, path)
}

// tid numbers the lanes from 0: the host first, then the GPUs.
func tid(lane int) int { return lane + 1 }

// Span is one span of a timeline file: its name, its lane's name ("host", "GPU 0", …), and when it
// began and how long it lasted, from the recording's start.
type Span struct {
	Name, Lane      string
	Start, Duration time.Duration
}

// ReadFile reads the spans of a timeline file that WriteFile wrote, in the file's order.
func ReadFile(path string) ([]Span, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	var file struct {
		TraceEvents []struct {
			Name  string            `json:"name"`
			Phase string            `json:"ph"`
			TS    float64           `json:"ts"` // microseconds
			Dur   float64           `json:"dur"`
			TID   int               `json:"tid"`
			Args  map[string]string `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("timeline: %s: %w", path, err)
	}
	lanes := map[int]string{}
	var spans []Span
	us := func(v float64) time.Duration { return time.Duration(v * 1e3) }
	for _, e := range file.TraceEvents {
		switch e.Phase {
		case "M":
			lanes[e.TID] = e.Args["name"]
		case "X":
			spans = append(spans, Span{e.Name, lanes[e.TID], us(e.TS), us(e.Dur)})
		}
	}
	return spans, nil
}
