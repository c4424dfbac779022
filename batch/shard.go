package batch

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Shard is one of Count disjoint slices of a jobs file, so that several machines (a CI matrix, a
// Kubernetes Indexed Job) share a batch: job k of the file (from 0) belongs to shard k mod
// Count, which spreads a file ordered by size evenly. Index counts from 0, like Kubernetes'
// JOB_COMPLETION_INDEX.
type Shard struct {
	Index int `json:"index"`
	Count int `json:"count"`
	// Jobs are the file positions of the shard's jobs, in order, and Total the file's number of
	// jobs: Merge puts the shards' results back in file order and finds missing shards.
	Jobs  []int `json:"jobs"`
	Total int   `json:"total"`
}

// ParseShard reads "I/N" (shard I of N, I from 0), or "N" alone with the index taken from the
// environment variable JOB_COMPLETION_INDEX, which Kubernetes sets in each pod of an Indexed Job.
func ParseShard(spec string) (Shard, error) {
	idx, count, ok := strings.Cut(spec, "/")
	if !ok {
		count, idx = spec, os.Getenv("JOB_COMPLETION_INDEX")
		if idx == "" {
			return Shard{}, fmt.Errorf("--shard %s: give I/N, or N with JOB_COMPLETION_INDEX set (a Kubernetes Indexed Job sets it)", spec)
		}
	}
	i, err1 := strconv.Atoi(idx)
	n, err2 := strconv.Atoi(count)
	if err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return Shard{}, fmt.Errorf("--shard %s: want I/N with 0 ≤ I < N (index %q, count %q)", spec, idx, count)
	}
	return Shard{Index: i, Count: n}, nil
}

// Select returns the shard's jobs and records which they are. The whole file is checked first
// (CheckJobs), so that two shards can never write one output.
func (s *Shard) Select(jobs []Job) ([]Job, error) {
	if err := CheckJobs(jobs); err != nil {
		return nil, err
	}
	s.Total, s.Jobs = len(jobs), nil
	var mine []Job
	for k, j := range jobs {
		if k%s.Count == s.Index {
			mine = append(mine, j)
			s.Jobs = append(s.Jobs, k)
		}
	}
	return mine, nil
}

// Merge makes one summary of the shards' summaries: the jobs in file order, the counts and the
// exit code over all of them, and the longest shard's time (they run at once). Shards missing
// from a complete set, or given twice, are an error: a merged summary that looks complete must be.
func Merge(shards []*Summary) (*Summary, error) {
	if len(shards) == 0 {
		return nil, fmt.Errorf("merge: no summaries")
	}
	count := -1
	seen := map[int]bool{}
	type placed struct {
		at  int
		job JobResult
	}
	var all []placed
	merged := &Summary{}
	for i, s := range shards {
		sh := s.Shard
		if sh == nil || len(sh.Jobs) != len(s.Jobs) {
			return nil, fmt.Errorf("merge: summary %d was not written by qpack batch --shard", i+1)
		}
		if count >= 0 && sh.Count != count {
			return nil, fmt.Errorf("merge: summary %d is shard %d/%d, the others are of %d shards", i+1, sh.Index, sh.Count, count)
		}
		if seen[sh.Index] {
			return nil, fmt.Errorf("merge: shard %d/%d is given twice", sh.Index, sh.Count)
		}
		count, seen[sh.Index] = sh.Count, true
		for k, r := range s.Jobs {
			all = append(all, placed{sh.Jobs[k], r})
		}
		merged.Seconds = max(merged.Seconds, s.Seconds)
	}
	var missing []string
	for i := range count {
		if !seen[i] {
			missing = append(missing, fmt.Sprintf("%d/%d", i, count))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("merge: shards %s are missing", strings.Join(missing, ", "))
	}
	sort.Slice(all, func(a, b int) bool { return all[a].at < all[b].at })
	for _, p := range all {
		merged.Jobs = append(merged.Jobs, p.job)
	}
	merged.count()
	return merged, nil
}
