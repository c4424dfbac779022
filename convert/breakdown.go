package convert

import (
	"fmt"
	"strings"
	"time"

	"github.com/qpack-dev/qpack/cuda"
)

// Phase is one line of a conversion's time breakdown: the time spent in a phase, the bytes it
// handled and their rate. Phases that run on several goroutines at once (the GPU quantizer's
// slots) count the time of each, so they can add up to more than the wall time.
type Phase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	Bytes   int64   `json:"bytes,omitempty"`
	GBps    float64 `json:"gb_per_s,omitempty"` // Bytes / Seconds / 1e9
}

func newPhase(name string, seconds float64, bytes int64) Phase {
	p := Phase{Name: name, Seconds: seconds, Bytes: bytes}
	if seconds > 0 {
		p.GBps = float64(bytes) / seconds / 1e9
	}
	return p
}

// breakdown splits a finished conversion's time by phase, the calibration's (blockRunner.phases)
// after the setup. On the GPU path the input is read
// straight into pinned memory, so reading and staging are one phase; the results are written
// from pinned memory (counted in write). Kept tensors are read by the write itself.
func (r *Report) breakdown(gs cuda.SlotStats, calibration []Phase) []Phase {
	sec := func(d time.Duration) float64 { return d.Seconds() }
	phases := append([]Phase{newPhase("setup", r.SetupSeconds, 0)}, calibration...)
	if gs.Calls > 0 {
		phases = append(phases,
			newPhase("gpu slot wait", sec(gs.Wait), 0),
			newPhase("read+staging", sec(gs.Staging), gs.InBytes),
			newPhase("h2d", sec(gs.Upload), gs.InBytes),
			newPhase("kernels", sec(gs.Kernels), gs.InBytes),
			newPhase("d2h", sec(gs.Download), gs.OutBytes))
	}
	var cpuSeconds float64
	var cpuBytes int64
	for _, t := range r.Tensors {
		if t.Device == DeviceCPU {
			cpuSeconds += t.Seconds
			cpuBytes += t.InBytes
		}
	}
	if cpuBytes > 0 {
		phases = append(phases, newPhase("cpu read+quantize+pack", cpuSeconds, cpuBytes))
	}
	return append(phases,
		newPhase("write", r.WriteSeconds, r.OutBytes),
		newPhase("hash", r.HashSeconds, r.hashedBytes),
		newPhase("hash wait", r.hashWaitSeconds, 0),
		newPhase("commit", r.CommitSeconds, r.OutBytes),
		newPhase("wall", r.Seconds, r.InBytes))
}

// formatPhases writes a breakdown on one line: "name 1.23s 4.5 GB/s, ...".
func formatPhases(phases []Phase) string {
	parts := make([]string, len(phases))
	for i, p := range phases {
		parts[i] = fmt.Sprintf("%s %.2fs", p.Name, p.Seconds)
		if p.Bytes > 0 {
			parts[i] += fmt.Sprintf(" %.1f GB/s", p.GBps)
		}
	}
	return strings.Join(parts, ", ")
}
