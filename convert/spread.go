package convert

import (
	"cmp"
	"slices"

	"github.com/qpack-dev/qpack/model"
	"golang.org/x/sync/errgroup"
)

// Solving a block's experts on several GPUs: a step of a block of experts updates many small
// groups (a Mixtral block's eight experts' gate/up, then their down_proj), each with a Hessian of
// its own. Shared among four GPUs row by row, each expert's down_proj took 67 ms on H100s, most of
// it its factorisation and the steps of its column loop, which do not shrink with the rows, one
// expert after another. Instead each bundle of groups (those with one source Hessian) is solved
// on one GPU, whole, while the other GPUs solve other bundles; the rows it replaced are then
// copied to the other GPUs' engines.

// spreads says whether an update's bundles are solved each on one GPU, the GPUs at once
// (solveSpread): in a block of experts calibrated on several GPUs, with a bundle for each GPU
// at least.
func (r *blockRunner) spreads(b *model.Block, bundles [][]int) bool {
	return r.gpu != nil && len(r.gpu.shards) > 1 && b.MoE != nil && len(bundles) >= len(r.gpu.shards)
}

// solveSpread solves each bundle on one GPU, every GPU its list of bundles at once
// (assignBundles). The Hessians are summed first, one after another: each sum runs on every GPU.
func (r *blockRunner) solveSpread(b *model.Block, groups, sources []model.Group, bundles [][]int) error {
	solves := make([]solveFunc, len(bundles))
	var releases []func()
	defer func() {
		for _, release := range releases {
			release()
		}
	}()
	for j, bundle := range bundles {
		solve, release, err := r.hessianOf(b.Index, sources[bundle[0]])
		if err != nil {
			return err
		}
		solves[j], releases = solve, append(releases, release)
	}
	sets := r.madeSets()
	var spread errgroup.Group
	for d, mine := range assignBundles(r.bundleCosts(b, groups, bundles), len(r.gpu.shards)) {
		spread.Go(func() error {
			pool := solverPool{first: sets[0].on(d), free: make(chan solverSet, len(sets)), sets: len(sets)}
			for _, set := range sets {
				pool.free <- set.on(d)
			}
			for _, j := range mine {
				if err := r.solveBundle(b, groups, bundles[j], solves[j], pool); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return spread.Wait()
}

// madeSets are the solver sets with a solver on every GPU (all of them but where making one
// failed). An update holds none of them between its solves, so each GPU's column of them is its
// own while the bundles are spread.
func (r *blockRunner) madeSets() []solverSet {
	var sets []solverSet
	for _, set := range r.all {
		if !slices.Contains(set, nil) {
			sets = append(sets, set)
		}
	}
	return sets
}

// bundleCosts estimates each bundle's time on a GPU: the weights of its planned linears plus k²
// for its factorisation (k its Hessian's width).
func (r *blockRunner) bundleCosts(b *model.Block, groups []model.Group, bundles [][]int) []int {
	costs := make([]int, len(bundles))
	for j, bundle := range bundles {
		k := 0
		for _, i := range bundle {
			for _, l := range b.Linears(groups[i]) {
				if _, planned := r.schemes[l.Name]; planned {
					costs[j] += l.Out * l.In
					k = l.In
				}
			}
		}
		costs[j] += k * k
	}
	return costs
}

// assignBundles gives each bundle (by cost) to one of gpus GPUs: the costliest first, each to the
// GPU with the least cost so far (the first of those). It returns each GPU's bundles in order.
func assignBundles(costs []int, gpus int) [][]int {
	order := make([]int, len(costs))
	for j := range order {
		order[j] = j
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(costs[b], costs[a]) })
	load := make([]int, gpus)
	lists := make([][]int, gpus)
	for _, j := range order {
		d := slices.Index(load, slices.Min(load))
		lists[d] = append(lists[d], j)
		load[d] += costs[j]
	}
	for _, list := range lists {
		slices.Sort(list)
	}
	return lists
}
