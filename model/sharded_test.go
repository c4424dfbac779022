package model

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

func TestShareSequences(t *testing.T) {
	for _, c := range []struct {
		n, parts int
		want     []int
	}{
		{8, 1, []int{0, 8}}, {8, 2, []int{0, 4, 8}}, {10, 4, []int{0, 3, 6, 8, 10}}, {3, 3, []int{0, 1, 2, 3}},
	} {
		if got := ShareSequences(c.n, c.parts); !slices.Equal(got, c.want) {
			t.Errorf("ShareSequences(%d, %d) = %v, want %v", c.n, c.parts, got, c.want)
		}
	}
}

// TestRendezvousRunsEachUpdateOnce: n goroutines arriving at several steps; each step's
// update runs once, after all n arrived, and everyone leaves with its result.
func TestRendezvousRunsEachUpdateOnce(t *testing.T) {
	const n, steps = 4, 50
	var arrived, updates atomic.Int64
	var fail = errors.New("step 7 failed")
	r := newRendezvous(n, func(b *Block, _ []Group) error {
		updates.Add(1)
		if got := arrived.Load(); got != int64(n*(b.Index+1)) {
			t.Errorf("step %d: update ran after %d arrivals, want %d", b.Index, got, n*(b.Index+1))
		}
		if b.Index == 7 {
			return fail
		}
		return nil
	})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for s := range steps {
				arrived.Add(1)
				err := r.arrive(&Block{Index: s}, nil)
				if want := s == 7; (err != nil) != want || (want && !errors.Is(err, fail)) {
					t.Errorf("step %d: arrive returned %v", s, err)
				}
			}
		})
	}
	wg.Wait()
	if updates.Load() != steps {
		t.Errorf("%d updates ran, want %d", updates.Load(), steps)
	}
}

// TestRendezvousAbandon: an engine that fails releases those waiting for it, and the update
// does not run.
func TestRendezvousAbandon(t *testing.T) {
	r := newRendezvous(3, func(*Block, []Group) error {
		t.Error("the update ran although an engine failed")
		return nil
	})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { errs[i] = r.arrive(&Block{}, nil) })
	}
	r.abandon()
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, errAbandoned) {
			t.Errorf("waiter %d: %v, want errAbandoned", i, err)
		}
	}
	if err := r.arrive(&Block{}, nil); !errors.Is(err, errAbandoned) {
		t.Errorf("an arrival after abandon: %v", err)
	}
}

func TestEachEngineReportsTheCause(t *testing.T) {
	cause := errors.New("out of memory")
	err := eachEngine(make([]*GPU, 3), func(i int, _ *GPU) error {
		if i == 2 {
			return cause
		}
		return errAbandoned
	})
	if err != cause {
		t.Errorf("eachEngine returned %v, want the failing engine's error", err)
	}
}
