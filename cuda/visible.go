package cuda

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Loading the driver (cuInit) initialises every GPU it sees, about 0.2 s each: on a host of four
// H200s 0.9 s with all four visible, 0.2 s with one. A command that uses some of a host's GPUs
// narrows what the driver sees to those (UseOnly) before it loads, through CUDA_VISIBLE_DEVICES;
// the GPUs keep the ordinals the command was given.

// visibleEnv is the variable that selects the GPUs the driver sees, and in what order.
const visibleEnv = "CUDA_VISIBLE_DEVICES"

var (
	shownMu sync.Mutex
	shown   []int // when narrowed: the ordinal of the driver's GPU i; nil: not narrowed
	loaded  bool  // the driver has begun loading: narrowing would no longer apply
	// the CUDA_VISIBLE_DEVICES the process was given, kept when UseOnly first changes it
	given    string
	givenSet bool
)

// UseOnly makes the driver, when it loads, see only the GPUs with these ordinals (counted as
// without it: after the CUDA_VISIBLE_DEVICES the process was given), in this order; Open,
// Devices and DeviceInfo.Ordinal keep those ordinals, and the other GPUs cannot be opened. A
// later call before the driver loads chooses again; once it has loaded (a command run again in
// the same process), UseOnly does nothing: the driver sees what it saw then.
func UseOnly(ordinals []int) error {
	shownMu.Lock()
	defer shownMu.Unlock()
	if loaded {
		return nil
	}
	if shown == nil {
		given, givenSet = os.LookupEnv(visibleEnv)
	}
	v, narrowed, err := narrowedVisible(given, givenSet, ordinals)
	switch {
	case err != nil:
		return err
	case !narrowed && shown == nil:
		return nil
	case !narrowed: // an earlier call narrowed: back to the variable as given
		shown = nil
		if !givenSet {
			return os.Unsetenv(visibleEnv)
		}
	}
	if err := os.Setenv(visibleEnv, v); err != nil {
		return fmt.Errorf("cuda: setting %s: %w", visibleEnv, err)
	}
	if narrowed {
		shown = slices.Clone(ordinals)
	}
	return nil
}

// narrowedVisible is the CUDA_VISIBLE_DEVICES that shows only the GPUs with these ordinals of
// those that given shows (when set: its entries, by position; else every GPU, by ordinal). When
// an ordinal is past given's entries it does not narrow (narrowed false): Open then says that
// there is no such GPU, as it would have.
func narrowedVisible(given string, set bool, ordinals []int) (v string, narrowed bool, err error) {
	var entries []string
	if set {
		for _, e := range strings.Split(given, ",") {
			if e = strings.TrimSpace(e); e != "" {
				entries = append(entries, e)
			}
		}
	}
	picked := make([]string, 0, len(ordinals))
	for i, o := range ordinals {
		switch {
		case o < 0 || slices.Contains(ordinals[:i], o):
			return "", false, fmt.Errorf("cuda: GPU ordinals %v: want distinct ordinals ≥ 0", ordinals)
		case !set:
			picked = append(picked, strconv.Itoa(o))
		case o < len(entries):
			picked = append(picked, entries[o])
		default:
			return given, false, nil
		}
	}
	return strings.Join(picked, ","), true, nil
}

// driverIndex is the driver's index of the GPU with this ordinal: the ordinal itself unless
// UseOnly narrowed what the driver sees.
func driverIndex(ordinal int) (int, error) {
	shownMu.Lock()
	defer shownMu.Unlock()
	if shown == nil {
		return ordinal, nil
	}
	i := slices.Index(shown, ordinal)
	if i < 0 {
		return 0, fmt.Errorf("cuda: GPU %d is not among the GPUs this command uses (%s)", ordinal, ordinalList(shown))
	}
	return i, nil
}

// ordinalAt is the ordinal of the driver's GPU i (driverIndex's inverse).
func ordinalAt(i int) int {
	shownMu.Lock()
	defer shownMu.Unlock()
	if shown == nil || i >= len(shown) {
		return i
	}
	return shown[i]
}

// markLoaded notes that the driver is loading: UseOnly is too late from now on.
func markLoaded() {
	shownMu.Lock()
	loaded = true
	shownMu.Unlock()
}

// narrowedNote says, for an error, what UseOnly showed the driver ("" when it did not narrow).
func narrowedNote() string {
	shownMu.Lock()
	defer shownMu.Unlock()
	if shown == nil {
		return ""
	}
	return fmt.Sprintf("; it was shown GPUs %s only, as %s=%s", ordinalList(shown), visibleEnv, os.Getenv(visibleEnv))
}

func ordinalList(ordinals []int) string {
	s := make([]string, len(ordinals))
	for i, o := range ordinals {
		s[i] = strconv.Itoa(o)
	}
	return strings.Join(s, ",")
}
