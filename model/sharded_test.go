package model

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/safetensors"
)

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

// TestShareCutsPartsEvenly: the shares of a block's parts, float32 values and raw weights (BF16
// and F32 bytes) among them, cover every value once, in order, at the same device addresses, in
// shares whose sizes differ by at most one value.
func TestShareCutsPartsEvenly(t *testing.T) {
	var parts []blockPart
	var values [][]float32 // each part's
	at := cuda.DevicePtr(1 << 20)
	for i, n := range []int{3, 1000, 17, 1, 4096, 255} {
		data := make([]float32, n)
		for j := range data {
			data[j] = float32((i*31 + j) % 256) // exact in BF16
		}
		p := blockPart{at: at, data: data}
		switch i % 3 {
		case 1:
			p = blockPart{at: at, raw: rawWeight{safetensors.EncodeFloat32(safetensors.BF16, data), safetensors.BF16}}
		case 2:
			p = blockPart{at: at, raw: rawWeight{safetensors.EncodeFloat32(safetensors.F32, data), safetensors.F32}}
		}
		parts, values = append(parts, p), append(values, data)
		at = at.Add(4*n + 256)
	}
	for _, n := range []int{1, 2, 3, 4, 7} {
		var got []blockPart
		sizes := map[int]bool{}
		for i := range n {
			size := 0
			for _, p := range share(parts, i, n) {
				got = append(got, p)
				size += p.len()
			}
			sizes[size] = true
		}
		if len(sizes) > 2 {
			t.Errorf("%d shares: sizes %v", n, sizes)
		}
		// Rejoin: every value once, at its address.
		var pieces []struct {
			at cuda.DevicePtr
			v  float32
		}
		for _, q := range got {
			v := q.data
			if q.raw.data != nil {
				v = make([]float32, q.len())
				if err := safetensors.DecodeFloat32(q.raw.dtype, v, q.raw.data); err != nil {
					t.Fatal(err)
				}
			}
			for j, x := range v {
				pieces = append(pieces, struct {
					at cuda.DevicePtr
					v  float32
				}{q.at.Add(4 * j), x})
			}
		}
		k := 0
		for i, p := range parts {
			for j, v := range values[i] {
				if k >= len(pieces) || pieces[k].at != p.at.Add(4*j) || pieces[k].v != v {
					t.Fatalf("%d shares: value %g of part %d at %#x missing (%d of %d values seen)", n, v, i, p.at.Add(4*j), k, len(pieces))
				}
				k++
			}
		}
		if k != len(pieces) {
			t.Errorf("%d shares: %d values, %d in the parts", n, len(pieces), k)
		}
	}
}
