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
	Since(2, time.Now().Add(-3*time.Millisecond), "driver: Alloc")
	r.Stop()
	Since(0, time.Now(), "after")
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
		if sp.Name == "driver: Alloc" && sp.Duration < 3*time.Millisecond {
			t.Errorf("a span since 3 ms ago lasted %v", sp.Duration)
		}
	}
	if len(spans) != 3 || spans["plan"] != "host" || spans["solve q_proj"] != "GPU 1" || spans["driver: Alloc"] != "GPU 2" {
		t.Errorf("spans on lanes %v; want plan on host, solve q_proj on GPU 1 and driver: Alloc on GPU 2 only", spans)
	}
}
