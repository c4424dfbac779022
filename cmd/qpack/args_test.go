package main

import (
	"slices"
	"testing"
)

// TestFlagsFirst: a command's flags move in front of its positional arguments, after the app's
// own flags and a subcommand's name; "--" keeps what follows positional.
func TestFlagsFirst(t *testing.T) {
	app := newApp()
	for _, c := range []struct{ in, want []string }{
		{[]string{"qpack", "convert", "src", "-o", "dst", "--overwrite"}, []string{"qpack", "convert", "-o", "dst", "--overwrite", "src"}},
		{[]string{"qpack", "--cpuprofile", "p", "convert", "src", "-o", "dst"}, []string{"qpack", "--cpuprofile", "p", "convert", "-o", "dst", "src"}},
		{[]string{"qpack", "--cpuprofile=p", "export", "gguf", "src", "-o", "f"}, []string{"qpack", "--cpuprofile=p", "export", "gguf", "-o", "f", "src"}},
		{[]string{"qpack", "inspect", "--", "-odd-dir"}, []string{"qpack", "inspect", "-odd-dir"}},
		{[]string{"qpack", "--version"}, []string{"qpack", "--version"}},
	} {
		if got := flagsFirst(app, c.in); !slices.Equal(got, c.want) {
			t.Errorf("flagsFirst(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
