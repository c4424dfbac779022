package iquant

import (
	"slices"
	"sync"

	"github.com/qpack-dev/qpack/quant"
)

// lattice is a grid's search tables, as ggml's iq2xs_init_impl and iq3xs_init_impl compute them
// at init: each grid point as levels l (the point's coordinates are 2l+1), a map from any vector
// of levels to its grid point, and for the vectors off the grid the list of grid points to try.
type lattice struct {
	dim    int       // coordinates per point: 8 or 4
	shift  int       // bits per level in an index: 2 or 3
	levels []int8    // levels[p·dim + i]: level of coordinate i of point p
	coords []float32 // coords[p·dim + i] = 2·levels[p·dim + i] + 1, for the neighbour search
	values []int     // values[l]: the grid's coordinate value of level l (a stored byte; −1, 0, 1 for IQ1)
	kmap   []int32   // by index Σ l_i << (shift·i): the point ≥ 0, or −1 − the start of its neighbour list
	// neighbours holds, per off-grid index, a count and then the points nearest to it (squared
	// distance of their 2l+1 coordinates, then index) up to the nwant-th distinct distance.
	neighbours []uint16
}

// lattices builds each grid's tables once; iq1_s and iq1_m share theirs. nwant is ggml's number
// of distinct distances kept per off-grid index, maxLevel the largest level a search rounds to.
var lattices = func() map[quant.IQType]func() *lattice {
	build := func(t quant.IQType, shift, nwant, maxLevel int) func() *lattice {
		return sync.OnceValue(func() *lattice { return newLattice(t, shift, nwant, maxLevel) })
	}
	iq1 := build(quant.IQ1S, 2, 3, 2)
	return map[quant.IQType]func() *lattice{
		quant.IQ2XXS: build(quant.IQ2XXS, 2, 2, 2),
		quant.IQ2XS:  build(quant.IQ2XS, 2, 2, 2),
		quant.IQ2S:   build(quant.IQ2S, 2, 1, 2),
		quant.IQ3XXS: build(quant.IQ3XXS, 3, 2, 7),
		quant.IQ3S:   build(quant.IQ3S, 3, 3, 7),
		quant.IQ1S:   iq1,
		quant.IQ1M:   iq1,
	}
}()

// newLattice derives the tables from the grid of t in package quant. A grid's distinct
// coordinate values, in increasing order, are levels 0, 1, 2, …: the magnitudes 8, 25, 43 of
// IQ2, 4, 12, …, 62 of iq3_xxs, 1, 3, …, 15 of iq3_s, and −1, 0, 1 of IQ1. Neighbour lists are
// built for the indices a search can produce (every level ≤ maxLevel).
func newLattice(t quant.IQType, shift, nwant, maxLevel int) *lattice {
	f, _ := t.Format()
	lat := &lattice{dim: f.Dim, shift: shift, levels: make([]int8, f.GridSize*f.Dim)}
	value := func(p, i int) int {
		b := uint8(t.GridPoint(uint16(p)) >> (8 * i))
		if f.Bits == 1 {
			return int(int8(b))
		}
		return int(b)
	}
	var values []int
	for p := range f.GridSize {
		for i := range f.Dim {
			if v := value(p, i); !slices.Contains(values, v) {
				values = append(values, v)
			}
		}
	}
	slices.Sort(values)
	lat.values = values
	lat.kmap = make([]int32, 1<<(shift*f.Dim))
	for i := range lat.kmap {
		lat.kmap[i] = -1
	}
	for p := range f.GridSize {
		u := 0
		for i := range f.Dim {
			l := slices.Index(values, value(p, i))
			lat.levels[p*f.Dim+i] = int8(l)
			u |= l << (shift * i)
		}
		lat.kmap[u] = int32(p)
	}
	lat.coords = make([]float32, len(lat.levels))
	for i, l := range lat.levels {
		lat.coords[i] = float32(2*l + 1)
	}
	lat.buildNeighbours(nwant, maxLevel)
	return lat
}

// buildNeighbours fills the neighbour lists of the off-grid indices whose levels are all at most
// maxLevel, in index order. Squared distances are small integers, so the points are bucketed by
// distance: listing the buckets in increasing distance, each in point order, is ggml's sort by
// (distance, index).
func (lat *lattice) buildNeighbours(nwant, maxLevel int) {
	points := len(lat.levels) / lat.dim
	pos := make([]int, lat.dim)
	d2 := make([]int, points)
	count := make([]int, lat.dim*4*(1<<lat.shift)*(1<<lat.shift)+1)
	for u := range lat.kmap {
		if lat.kmap[u] >= 0 || !lat.levelsAtMost(u, maxLevel, pos) {
			continue
		}
		clear(count)
		for p := range points {
			d := 0
			for i, l := range lat.point(p) {
				e := 2*int(l) + 1 - pos[i]
				d += e * e
			}
			d2[p] = d
			count[d]++
		}
		lat.kmap[u] = -1 - int32(len(lat.neighbours))
		start := len(lat.neighbours)
		lat.neighbours = append(lat.neighbours, 0)
		for d, distinct := 0, 0; d < len(count) && distinct < nwant; d++ {
			if count[d] == 0 {
				continue
			}
			distinct++
			for p := range points {
				if d2[p] == d {
					lat.neighbours = append(lat.neighbours, uint16(p))
				}
			}
		}
		lat.neighbours[start] = uint16(len(lat.neighbours) - start - 1)
	}
}

// levelsAtMost reports whether every level of index u is at most max, writing the coordinates
// 2l+1 to pos.
func (lat *lattice) levelsAtMost(u, max int, pos []int) bool {
	mask := 1<<lat.shift - 1
	for i := range pos {
		l := u >> (lat.shift * i) & mask
		if l > max {
			return false
		}
		pos[i] = 2*l + 1
	}
	return true
}

// index returns the kmap index of the levels L (each in [0, 2^shift)).
func (lat *lattice) index(L []int8) int {
	u := 0
	for i, l := range L {
		u |= int(l) << (lat.shift * i)
	}
	return u
}

// onGrid returns the point with levels L, or −1 (also for a level outside [0, 2^shift)).
func (lat *lattice) onGrid(L []int8) int {
	for _, l := range L {
		if l < 0 || int(l) >= 1<<lat.shift {
			return -1
		}
	}
	if p := lat.kmap[lat.index(L)]; p >= 0 {
		return int(p)
	}
	return -1
}

// nearest is ggml's iq2_find_best_neighbour / iq3_find_best_neighbour for the off-grid levels
// L: among their neighbours, the point p minimising Σ w_i·(scale·(2l_i+1) − x_i)² (the first
// on ties). It writes p's levels to L and returns p, or −1 when no distance is below float32's
// largest (NaN or overflowing weights: ggml aborts).
func (lat *lattice) nearest(L []int8, x, w []float32, scale float32) int {
	return lat.nearestFrom(lat.kmap[lat.index(L)], L, x, w, scale)
}

// nearestFrom is nearest given L's entry in the map (negative: off the grid).
func (lat *lattice) nearestFrom(entry int32, L []int8, x, w []float32, scale float32) int {
	start := -1 - int(entry)
	list := lat.neighbours[start+1 : start+1+int(lat.neighbours[start])]
	var best int
	if lat.dim == 8 {
		best = nearest8(lat.coords, list, (*[8]float32)(x), (*[8]float32)(w), scale)
	} else {
		best = nearest4(lat.coords, list, (*[4]float32)(x), (*[4]float32)(w), scale)
	}
	if best >= 0 {
		copy(L, lat.point(best))
	}
	return best
}

// nearest8 and nearest4 are nearest's distance loop for points of 8 and 4 coordinates, written
// out for each size so that the compiler drops the bounds checks and the loop.
func nearest8(coords []float32, list []uint16, x, w *[8]float32, scale float32) int {
	best, bestD2 := -1, maxFloat32
	for _, p := range list {
		c := (*[8]float32)(coords[int(p)*8:])
		d2 := dist(0, c[0], x[0], w[0], scale)
		d2 = dist(d2, c[1], x[1], w[1], scale)
		d2 = dist(d2, c[2], x[2], w[2], scale)
		d2 = dist(d2, c[3], x[3], w[3], scale)
		d2 = dist(d2, c[4], x[4], w[4], scale)
		d2 = dist(d2, c[5], x[5], w[5], scale)
		d2 = dist(d2, c[6], x[6], w[6], scale)
		d2 = dist(d2, c[7], x[7], w[7], scale)
		if d2 < bestD2 {
			best, bestD2 = int(p), d2
		}
	}
	return best
}

// dist is d2 + w·(scale·c − x)², rounded as ggml rounds it.
func dist(d2, c, x, w, scale float32) float32 {
	diff := float32(scale*c) - x
	return d2 + float32(float32(w*diff)*diff)
}

func nearest4(coords []float32, list []uint16, x, w *[4]float32, scale float32) int {
	best, bestD2 := -1, maxFloat32
	for _, p := range list {
		c := (*[4]float32)(coords[int(p)*4:])
		d2 := dist(0, c[0], x[0], w[0], scale)
		d2 = dist(d2, c[1], x[1], w[1], scale)
		d2 = dist(d2, c[2], x[2], w[2], scale)
		d2 = dist(d2, c[3], x[3], w[3], scale)
		if d2 < bestD2 {
			best, bestD2 = int(p), d2
		}
	}
	return best
}

// point returns the levels of point p.
func (lat *lattice) point(p int) []int8 { return lat.levels[p*lat.dim : (p+1)*lat.dim] }
