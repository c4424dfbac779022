package alloc

import (
	"bytes"
	"fmt"
	"io"
	"text/tabwriter"
)

// Explain prints the plan as a table (tensor, scheme, bytes, bpw, reason; pinned tensors
// marked), then its totals and warnings.
func (p *Plan) Explain(out io.Writer) error {
	var w bytes.Buffer // written in one piece, so a failing writer gives one error
	tw := tabwriter.NewWriter(&w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "TENSOR\tSCHEME\tBYTES\tBPW\tREASON\n")
	for _, e := range p.Entries {
		scheme := e.Scheme
		if e.Pinned {
			scheme += " (pinned)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%s\n", e.Name, scheme, e.Bytes, e.BPW, e.Reason)
	}
	tw.Flush() // cannot fail on a bytes.Buffer
	t := p.Totals
	fmt.Fprintf(&w, "\nstrategy %s: %d tensors, %d quantized, %d pinned\n", p.Strategy, t.Tensors, t.Quantized, t.Pinned)
	fmt.Fprintf(&w, "candidates: %d params, %d bytes, %.4f bpw\n", t.CandidateParams, t.CandidateBytes, t.CandidateBPW)
	fmt.Fprintf(&w, "checkpoint: %d params, %d bytes (input %d bytes), %.4f bpw\n", t.Params, t.Bytes, t.InputBytes, t.BPW)
	if t.Sensitivity > 0 {
		fmt.Fprintf(&w, "total measured sensitivity: %.6g\n", t.Sensitivity)
	}
	if b := p.Budget; b != nil {
		fmt.Fprint(&w, "budget: target")
		if b.TargetBPW > 0 {
			fmt.Fprintf(&w, " %g bpw", b.TargetBPW)
		}
		if b.TargetBytes > 0 {
			fmt.Fprintf(&w, " %d bytes", b.TargetBytes)
		}
		fmt.Fprintf(&w, "; %d bytes for unpinned candidates; solver %s", b.FreeBytes, b.Solver)
		if b.Solver == "lagrangian" {
			fmt.Fprintf(&w, ", λ=%.4g error per MiB", b.Lambda*(1<<20))
		}
		fmt.Fprintln(&w)
	}
	for _, warn := range p.Warnings {
		fmt.Fprintf(&w, "warning: %s\n", warn)
	}
	_, err := out.Write(w.Bytes())
	return err
}
