package alloc

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/qpack-dev/qpack/quant"
)

// PlanVersion identifies the JSON layout of a Plan.
const PlanVersion = 1

// Plan is a scheme for every tensor of a checkpoint, with the reason for each. Written as JSON
// it is what `convert --plan` replays.
type Plan struct {
	Version   int      `json:"version"`
	Strategy  string   `json:"strategy"`
	Ladder    []string `json:"ladder,omitempty"`
	Overrides []string `json:"overrides,omitempty"`
	Budget    *Budget  `json:"budget,omitempty"`
	Warnings  []string `json:"warnings,omitempty"`
	Entries   []Entry  `json:"entries"` // sorted by tensor name
	Totals    Totals   `json:"totals"`
}

// Budget records what the budget strategy was asked for and how it solved it.
type Budget struct {
	TargetBPW   float64 `json:"target_bpw,omitempty"`
	TargetBytes int64   `json:"target_bytes,omitempty"`
	FreeBytes   int64   `json:"free_bytes"` // what the unpinned candidates could spend
	Solver      string  `json:"solver"`     // "dp" (exact) or "lagrangian"
	Lambda      float64 `json:"lambda,omitempty"`
}

// Entry is one tensor's verdict.
type Entry struct {
	Name        string             `json:"name"`
	Scheme      string             `json:"scheme"` // "keep" or a canonical scheme name
	Reason      string             `json:"reason"`
	Pinned      bool               `json:"pinned,omitempty"`
	Candidate   bool               `json:"candidate,omitempty"` // counted in the candidates' bpw
	Params      int64              `json:"params"`
	Bytes       int64              `json:"bytes"`
	BPW         float64            `json:"bpw"`
	Sensitivity map[string]float64 `json:"sensitivity,omitempty"` // scheme → measured relative error
}

// Totals sums a plan.
type Totals struct {
	Tensors         int     `json:"tensors"`
	Quantized       int     `json:"quantized"`
	Pinned          int     `json:"pinned"`
	Params          int64   `json:"params"`
	Bytes           int64   `json:"bytes"`       // the whole output checkpoint
	InputBytes      int64   `json:"input_bytes"` // the whole input checkpoint
	CandidateParams int64   `json:"candidate_params"`
	CandidateBytes  int64   `json:"candidate_bytes"`
	CandidateBPW    float64 `json:"candidate_bpw"` // CandidateBytes·8 / CandidateParams
	BPW             float64 `json:"bpw"`           // Bytes·8 / Params
	Sensitivity     float64 `json:"sensitivity"`   // Σ measured sensitivity at the chosen schemes
}

// Choice returns the entry's scheme as a Choice.
func (e Entry) Choice() (Choice, error) {
	c, err := ParseChoice(e.Scheme)
	if err != nil {
		return Choice{}, fmt.Errorf("plan entry %s: %w", e.Name, err)
	}
	return c, nil
}

// Lookup returns the entry for a tensor.
func (p *Plan) Lookup(name string) (Entry, bool) {
	i, ok := slices.BinarySearchFunc(p.Entries, name, func(e Entry, n string) int { return strings.Compare(e.Name, n) })
	if !ok {
		return Entry{}, false
	}
	return p.Entries[i], true
}

// WriteJSON writes the plan as indented JSON.
func (p *Plan) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(p)
}

// ReadPlan reads a plan written by WriteJSON. Unknown fields are an error, so that a plan from
// a newer qpack is not silently half-read.
func ReadPlan(r io.Reader) (*Plan, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var p Plan
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if p.Version != PlanVersion {
		return nil, fmt.Errorf("plan: version %d, this qpack reads version %d", p.Version, PlanVersion)
	}
	return &p, nil
}

// Validate checks the plan against a checkpoint's tensors: one entry per tensor, in name order,
// no unknown tensors, every scheme valid, applicable to its tensor, and (when supports is not
// nil) one the output format can hold.
func (p *Plan) Validate(tensors []TensorDesc, supports SupportsFunc) error {
	byName := make(map[string]TensorDesc, len(tensors))
	for _, t := range tensors {
		byName[t.Name] = t
	}
	for i, e := range p.Entries {
		if i > 0 && p.Entries[i-1].Name >= e.Name {
			return fmt.Errorf("plan: entries not sorted by name or duplicated at %s", e.Name)
		}
		t, ok := byName[e.Name]
		if !ok {
			return fmt.Errorf("plan names tensor %s, which the checkpoint does not have", e.Name)
		}
		if e.Params != t.Params {
			return fmt.Errorf("plan entry %s: %d params, the checkpoint's tensor has %d", e.Name, e.Params, t.Params)
		}
		c, err := e.Choice()
		if err != nil {
			return err
		}
		if c.Keep {
			continue
		}
		if !t.quantizable() {
			return fmt.Errorf("plan entry %s: scheme %s on a %s tensor, which is never quantized", e.Name, c, roleWord(t))
		}
		if supports != nil {
			if err := supports(c.Scheme); err != nil {
				return fmt.Errorf("plan entry %s: %w", e.Name, err)
			}
		}
	}
	if len(p.Entries) != len(tensors) {
		for _, t := range tensors {
			if _, ok := p.Lookup(t.Name); !ok {
				return fmt.Errorf("checkpoint tensor %s is missing from the plan", t.Name)
			}
		}
	}
	return nil
}

// SupportsFunc reports whether the output format can hold a scheme (nil error) or why not.
type SupportsFunc func(s quant.Scheme) error

// sumTotals recomputes the totals from the entries (input sizes come from the planner).
func sumTotals(entries []Entry, inputBytes int64) Totals {
	t := Totals{Tensors: len(entries), InputBytes: inputBytes}
	for _, e := range entries {
		t.Params += e.Params
		t.Bytes += e.Bytes
		if e.Scheme != KeepName {
			t.Quantized++
		}
		if e.Pinned {
			t.Pinned++
		}
		if e.Candidate {
			t.CandidateParams += e.Params
			t.CandidateBytes += e.Bytes
		}
		t.Sensitivity += e.Sensitivity[e.Scheme]
	}
	t.BPW = bitsPerWeight(t.Bytes, t.Params)
	t.CandidateBPW = bitsPerWeight(t.CandidateBytes, t.CandidateParams)
	return t
}

func bitsPerWeight(bytes, params int64) float64 {
	if params == 0 {
		return 0
	}
	return float64(bytes) * 8 / float64(params)
}
