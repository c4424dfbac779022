package cuda

import (
	"os"
	"strings"
	"testing"
)

func TestNarrowedVisible(t *testing.T) {
	for _, c := range []struct {
		given    string
		set      bool
		ordinals []int
		want     string
		narrowed bool
		err      string
	}{
		{"", false, []int{2}, "2", true, ""},
		{"", false, []int{3, 0, 1}, "3,0,1", true, ""},
		{"4,5,6,7", true, []int{1, 3}, "5,7", true, ""},
		{"GPU-aa, GPU-bb ,GPU-cc", true, []int{2, 0}, "GPU-cc,GPU-aa", true, ""},
		{"MIG-x", true, []int{0}, "MIG-x", true, ""},
		{"4,5", true, []int{1, 2}, "4,5", false, ""}, // no GPU 2 among those given: left as it was, for Open to say so
		{"", true, []int{0}, "", false, ""},          // none given
		{"", false, []int{1, 1}, "", false, "distinct"},
		{"", false, []int{-1}, "", false, "distinct"},
	} {
		got, narrowed, err := narrowedVisible(c.given, c.set, c.ordinals)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("narrowedVisible(%q, %v, %v): error %v, want one saying %q", c.given, c.set, c.ordinals, err, c.err)
		case c.err == "" && (err != nil || got != c.want || narrowed != c.narrowed):
			t.Errorf("narrowedVisible(%q, %v, %v) = %q, %v, %v; want %q, %v", c.given, c.set, c.ordinals, got, narrowed, err, c.want, c.narrowed)
		}
	}
}

// TestUseOnlyKeepsOrdinals: after UseOnly the driver's GPU i is the i-th ordinal given, the
// variable shows the driver just those, and other ordinals cannot be opened; a second call
// before the driver loads chooses again from the variable as the process was given it; after
// the driver loaded, UseOnly changes nothing.
func TestUseOnlyKeepsOrdinals(t *testing.T) {
	shownMu.Lock()
	savedShown, savedLoaded := shown, loaded
	shown, loaded = nil, false
	shownMu.Unlock()
	t.Cleanup(func() {
		shownMu.Lock()
		shown, loaded = savedShown, savedLoaded
		shownMu.Unlock()
	})
	t.Setenv(visibleEnv, "4,5,6,7")
	if err := UseOnly([]int{4}); err != nil || os.Getenv(visibleEnv) != "4,5,6,7" || ordinalAt(4) != 4 { // no GPU 4 given: nothing changes
		t.Fatalf("UseOnly(4) of four: %v, %s = %q", err, visibleEnv, os.Getenv(visibleEnv))
	}
	if err := UseOnly([]int{2}); err != nil {
		t.Fatal(err)
	}
	if err := UseOnly([]int{3, 1}); err != nil {
		t.Fatal(err)
	}
	if got := os.Getenv(visibleEnv); got != "7,5" {
		t.Errorf("%s = %q, want 7,5", visibleEnv, got)
	}
	for i, o := range []int{3, 1} {
		if got := ordinalAt(i); got != o {
			t.Errorf("ordinalAt(%d) = %d, want %d", i, got, o)
		}
		if got, err := driverIndex(o); err != nil || got != i {
			t.Errorf("driverIndex(%d) = %d, %v; want %d", o, got, err, i)
		}
	}
	if _, err := driverIndex(0); err == nil || !strings.Contains(err.Error(), "not among the GPUs this command uses (3,1)") {
		t.Errorf("driverIndex(0) after UseOnly(3,1): %v", err)
	}
	if err := UseOnly([]int{9}); err != nil || os.Getenv(visibleEnv) != "4,5,6,7" || ordinalAt(1) != 1 { // no GPU 9: as given again
		t.Errorf("UseOnly(9) after UseOnly(3,1): %v, %s = %q, GPU 1 is %d", err, visibleEnv, os.Getenv(visibleEnv), ordinalAt(1))
	}
	if err := UseOnly([]int{3, 1}); err != nil {
		t.Fatal(err)
	}
	shownMu.Lock()
	loaded = true
	shownMu.Unlock()
	if err := UseOnly([]int{0}); err != nil || os.Getenv(visibleEnv) != "7,5" || ordinalAt(0) != 3 {
		t.Errorf("UseOnly after the driver loaded: %v, %s = %q, GPU 0 is %d", err, visibleEnv, os.Getenv(visibleEnv), ordinalAt(0))
	}
}
