package timeline

import (
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
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	spans := map[string]string{} // name → lane
	for _, sp := range got {
		spans[sp.Name] = sp.Lane
		if sp.Name == "plan" && sp.Duration < 2*time.Millisecond {
			t.Errorf("plan lasted %v, slept 2 ms", sp.Duration)
		}
	}
	if len(spans) != 2 || spans["plan"] != "host" || spans["solve q_proj"] != "GPU 1" {
		t.Errorf("spans on lanes %v; want plan on host and solve q_proj on GPU 1 only", spans)
	}
}
