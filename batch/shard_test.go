package batch

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestParseShard(t *testing.T) {
	t.Setenv("JOB_COMPLETION_INDEX", "")
	for spec, want := range map[string]Shard{"0/1": {Index: 0, Count: 1}, "2/3": {Index: 2, Count: 3}} {
		got, err := ParseShard(spec)
		if err != nil || got.Index != want.Index || got.Count != want.Count {
			t.Errorf("ParseShard(%q) = %+v, %v", spec, got, err)
		}
	}
	for _, spec := range []string{"3/3", "-1/2", "1/0", "a/2", "1/b", "4"} {
		if _, err := ParseShard(spec); err == nil {
			t.Errorf("ParseShard(%q) accepted", spec)
		}
	}
	t.Setenv("JOB_COMPLETION_INDEX", "3")
	if got, err := ParseShard("4"); err != nil || got.Index != 3 || got.Count != 4 {
		t.Errorf("ParseShard(4) with JOB_COMPLETION_INDEX=3: %+v, %v", got, err)
	}
}

// The shards of a file are disjoint and cover it, and their merged summary is the file's jobs
// in order with the counts and exit code over all of them.
func TestShardsMerge(t *testing.T) {
	var jobs []Job
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		jobs = append(jobs, Job{Name: name, Source: "src", Output: filepath.Join("out", name)})
	}
	status := map[string]string{"a": StatusPassed, "b": StatusFailed, "c": StatusSkipped, "d": StatusPassed, "e": StatusPassed}
	var summaries []*Summary
	ran := map[string]int{}
	for i := range 2 {
		sh := Shard{Index: i, Count: 2}
		mine, err := sh.Select(jobs)
		if err != nil {
			t.Fatal(err)
		}
		s := &Summary{Shard: &sh, Seconds: float64(10 * (i + 1))}
		for _, j := range mine {
			ran[j.Name]++
			s.Jobs = append(s.Jobs, JobResult{Name: j.Name, Status: status[j.Name]})
		}
		s.count()
		summaries = append(summaries, s)
	}
	if len(ran) != 5 || ran["a"] != 1 || len(summaries[0].Jobs) != 3 || summaries[0].Jobs[1].Name != "c" {
		t.Fatalf("shards ran %v; shard 0: %+v", ran, summaries[0].Jobs)
	}
	m, err := Merge([]*Summary{summaries[1], summaries[0]})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range m.Jobs {
		names = append(names, r.Name)
	}
	if strings.Join(names, "") != "abcde" || m.Passed != 3 || m.Failed != 1 || m.Skipped != 1 || m.ExitCode != 1 || m.Seconds != 20 {
		t.Errorf("merged: %v, %+v", names, m)
	}
	for _, c := range []struct {
		summaries []*Summary
		want      string
	}{
		{[]*Summary{summaries[0]}, "shards 1/2 are missing"},
		{[]*Summary{summaries[0], summaries[0], summaries[1]}, "given twice"},
		{[]*Summary{summaries[0], {Jobs: summaries[1].Jobs}}, "not written by qpack batch --shard"},
	} {
		if _, err := Merge(c.summaries); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}
