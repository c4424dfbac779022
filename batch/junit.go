package batch

import (
	"encoding/xml"
	"fmt"
	"io"
)

// JUnit XML, as CI systems (Jenkins, GitLab, GitHub Actions' test reporters) read it: one test
// suite, one test case per job; a failed verification is a <failure>, a job that could not run an
// <error>, a job that never started <skipped>. An up-to-date job that was not redone counts as
// run: its verification (when asked) ran again.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	ClassName string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitProblem `xml:"failure,omitempty"`
	Error     *junitProblem `xml:"error,omitempty"`
	Skipped   *junitProblem `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitProblem struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the summary as JUnit XML.
func (s *Summary) WriteJUnit(w io.Writer) error {
	suite := junitSuite{Name: "qpack batch", Tests: len(s.Jobs), Time: seconds(s.Seconds)}
	for _, r := range s.Jobs {
		c := junitCase{Name: r.Name, ClassName: "qpack.batch", Time: seconds(r.Seconds), SystemOut: caseOutput(r)}
		switch r.Status {
		case StatusVerifyFailed:
			c.Failure = &junitProblem{Message: r.Error, Type: "verify", Text: r.Error}
			suite.Failures++
		case StatusFailed, StatusInterrupted:
			c.Error = &junitProblem{Message: r.Error, Type: r.Status, Text: r.Error}
			suite.Errors++
		case StatusNotRun:
			c.Skipped = &junitProblem{Message: "the batch stopped before this job"}
			suite.Skipped++
		}
		suite.Cases = append(suite.Cases, c)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{suite}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// caseOutput is the job's result in a line, for the test case's output.
func caseOutput(r JobResult) string {
	out := fmt.Sprintf("%s: %s → %s", r.Status, r.Source, r.Output)
	if r.Bytes > 0 {
		out += fmt.Sprintf("; %d bytes, %.3f bits/weight", r.Bytes, r.BPW)
	}
	if v := r.Verify; v != nil {
		out += fmt.Sprintf("; perplexity %.4f", v.Perplexity)
		if v.Reference != "" {
			out += fmt.Sprintf(" (reference %.4f), KL mean %.5f, top-1 %.4f", v.ReferencePerplexity, v.MeanKL, v.Top1Agreement)
		}
	}
	if r.Reason != "" {
		out += "; " + r.Reason
	}
	return out
}

func seconds(s float64) string { return fmt.Sprintf("%.3f", s) }
