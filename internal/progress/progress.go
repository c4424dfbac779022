// Package progress shows how far long work has got: one redrawn line on a terminal, a plain
// log line every few seconds elsewhere (CI logs).
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Meter reports progress to a writer. A nil *Meter reports nothing, so callers need not check.
type Meter struct {
	w     io.Writer
	label string
	unit  string // what Done counts: "tensors", "jobs"
	tty   bool
	// Every is the least time between two plain lines (default 5 s); a plain line is also
	// written when another tenth of the work is done.
	Every time.Duration

	mu       sync.Mutex
	start    time.Time
	last     time.Time // last line written
	lastTen  int       // tenths done at the last plain line
	drawn    bool      // a terminal line is on screen
	line     string    // the line last drawn
	now      func() time.Time
	finished bool
}

// New returns a meter writing to w, labelled with label (e.g. "convert"), counting unit
// ("tensors"). It redraws one line when w is a terminal.
func New(w io.Writer, label, unit string) *Meter {
	return &Meter{w: w, label: label, unit: unit, tty: IsTerminal(w), Every: 5 * time.Second, now: time.Now, start: time.Now()}
}

// IsTerminal reports whether w is a character device (a terminal), not a file or a pipe.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Update reports done of total items and bytes of totalBytes (either total may be 0: unknown).
// It is safe to call from several goroutines.
func (m *Meter) Update(done, total int, bytes, totalBytes int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	line := Line(m.label, m.unit, done, total, bytes, totalBytes, now.Sub(m.start))
	if m.tty {
		if now.Sub(m.last) < 100*time.Millisecond && done != total {
			return // redrawing faster than the eye reads costs time for nothing
		}
		fmt.Fprintf(m.w, "\r\x1b[K%s", line)
		m.drawn, m.last, m.line = true, now, line
		return
	}
	ten := int(10 * max(0, fraction(done, total, bytes, totalBytes)))
	if now.Sub(m.last) < m.Every && ten == m.lastTen && done != total {
		return
	}
	if done == total && m.finished {
		return
	}
	m.finished = done == total
	fmt.Fprintln(m.w, line)
	m.last, m.lastTen = now, ten
}

// Finish ends a terminal's redrawn line so that later output starts on a new line.
func (m *Meter) Finish() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.drawn {
		fmt.Fprintln(m.w)
		m.drawn = false
	}
}

// Line formats one progress line: "convert: 12/39 tensors (31%), 1.2 GB of 3.9 GB, 240 MB/s, 11s
// elapsed, ETA 12s".
func Line(label, unit string, done, total int, bytes, totalBytes int64, elapsed time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d", label, done)
	if total > 0 {
		fmt.Fprintf(&b, "/%d", total)
	}
	fmt.Fprintf(&b, " %s", unit)
	frac := fraction(done, total, bytes, totalBytes)
	if frac >= 0 {
		fmt.Fprintf(&b, " (%d%%)", int(100*frac))
	}
	if bytes > 0 {
		fmt.Fprintf(&b, ", %s", Bytes(bytes))
		if totalBytes > 0 {
			fmt.Fprintf(&b, " of %s", Bytes(totalBytes))
		}
		if s := elapsed.Seconds(); s > 0 {
			fmt.Fprintf(&b, ", %s/s", Bytes(int64(float64(bytes)/s)))
		}
	}
	fmt.Fprintf(&b, ", %s elapsed", round(elapsed))
	if frac > 0 && frac < 1 {
		fmt.Fprintf(&b, ", ETA %s", round(time.Duration(float64(elapsed)*(1-frac)/frac)))
	}
	return b.String()
}

// Bytes writes n in decimal units (kB, MB, GB), three significant digits.
func Bytes(n int64) string {
	units := []string{"B", "kB", "MB", "GB", "TB"}
	v, i := float64(n), 0
	for v >= 1000 && i < len(units)-1 {
		v /= 1000
		i++
	}
	switch {
	case i == 0:
		return fmt.Sprintf("%d B", n)
	case v < 10:
		return fmt.Sprintf("%.2f %s", v, units[i])
	case v < 100:
		return fmt.Sprintf("%.1f %s", v, units[i])
	}
	return fmt.Sprintf("%.0f %s", v, units[i])
}

func round(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

// Log returns a writer for log lines that share the meter's terminal: each write clears the
// progress line, writes the log text and draws the progress line again below it. Off a
// terminal it is w itself.
func (m *Meter) Log(w io.Writer) io.Writer {
	if m == nil || !m.tty {
		return w
	}
	return logWriter{m: m, w: w}
}

type logWriter struct {
	m *Meter
	w io.Writer
}

func (l logWriter) Write(b []byte) (int, error) {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.m.drawn {
		fmt.Fprint(l.m.w, "\r\x1b[K")
	}
	n, err := l.w.Write(b)
	if l.m.drawn {
		fmt.Fprint(l.m.w, l.m.line)
	}
	return n, err
}

// fraction is the share of the work done, by bytes when their total is known, else by count;
// -1 when neither total is known.
func fraction(done, total int, bytes, totalBytes int64) float64 {
	switch {
	case totalBytes > 0:
		return float64(bytes) / float64(totalBytes)
	case total > 0:
		return float64(done) / float64(total)
	}
	return -1
}
