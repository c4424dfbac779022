package timeline

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestRecordingWritesSpansPerLane(t *testing.T) {
	Begin(0, "before")() // no recording: nothing kept
	r := Start()
	if !On() {
		t.Fatal("On() is false during a recording")
	}
	end := Begin(Host, "plan")
	time.Sleep(2 * time.Millisecond)
	end()
	Begin(1, "solve %s", "q_proj")()
	r.Stop()
	Begin(0, "after")()
	if On() {
		t.Fatal("On() is true after Stop")
	}
	path := filepath.Join(t.TempDir(), "trace.json")
	if err := r.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		TraceEvents []struct {
			Name  string            `json:"name"`
			Phase string            `json:"ph"`
			Dur   float64           `json:"dur"`
			TID   int               `json:"tid"`
			Args  map[string]string `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	spans, lanes := map[string]int{}, map[int]string{}
	for _, e := range file.TraceEvents {
		switch e.Phase {
		case "X":
			spans[e.Name] = e.TID
			if e.Name == "plan" && e.Dur < 2000 {
				t.Errorf("plan lasted %.0f µs, slept 2000", e.Dur)
			}
		case "M":
			lanes[e.TID] = e.Args["name"]
		}
	}
	if len(spans) != 2 || lanes[spans["plan"]] != "host" || lanes[spans["solve q_proj"]] != "GPU 1" {
		t.Errorf("spans %v on lanes %v; want plan on host and solve q_proj on GPU 1 only", spans, lanes)
	}
}
