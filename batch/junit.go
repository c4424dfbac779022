package batch

import (
	"encoding/xml"
	"fmt"
	"io"
)

// JUnit XML, the report format CI systems read: one test suite, a test case per job; a failed
// verify threshold is a <failure>, a job that could not run (or was interrupted) an <error>,
// an up-to-date job <skipped>.
type junitSuites struct {
	XMLName  xml.Name   `xml:"testsuites"`
	Tests    int        `xml:"tests,attr"`
	Failures int        `xml:"failures,attr"`
	Errors   int        `xml:"errors,attr"`
	Skipped  int        `xml:"skipped,attr"`
	Time     string     `xml:"time,attr"`
	Suite    junitSuite `xml:"testsuite"`
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
	Failure   *junitMessage `xml:"failure,omitempty"`
	Error     *junitMessage `xml:"error,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the summary as JUnit XML.
func (s *Summary) WriteJUnit(w io.Writer) error {
	seconds := func(v float64) string { return fmt.Sprintf("%.3f", v) }
	suite := junitSuite{Name: "qpack batch", Tests: len(s.Jobs), Failures: s.Failed, Errors: s.Errors + s.Interrupted,
		Skipped: s.Skipped, Time: seconds(s.Seconds)}
	for _, r := range s.Jobs {
		c := junitCase{Name: r.Name, ClassName: "qpack.batch", Time: seconds(r.Seconds),
			SystemOut: fmt.Sprintf("%s → %s: %s, %d bytes, %.3f bits/weight", r.Source, r.Output, r.Status, r.Bytes, r.BPW)}
		if r.Perplexity != 0 {
			c.SystemOut += fmt.Sprintf(", perplexity %.4f (reference %.4f), mean KL %.5f, top-1 %.4f", r.Perplexity, r.ReferencePerplexity, r.MeanKL, r.Top1Agreement)
		}
		switch r.Status {
		case StatusFailed:
			c.Failure = &junitMessage{Message: r.Error, Type: "verify", Text: r.Error}
		case StatusError, StatusInterrupted:
			c.Error = &junitMessage{Message: r.Error, Type: r.Status, Text: r.Error}
		case StatusSkipped:
			c.Skipped = &junitMessage{Message: "up to date: " + r.UpToDate}
		}
		suite.Cases = append(suite.Cases, c)
	}
	doc := junitSuites{Tests: suite.Tests, Failures: suite.Failures, Errors: suite.Errors, Skipped: suite.Skipped, Time: suite.Time, Suite: suite}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}
