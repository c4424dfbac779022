package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// run executes the CLI in-process and returns stdout.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	app.ErrWriter = &out
	err := app.Run(append([]string{"qpack"}, args...))
	return out.String(), err
}

func TestInspectCommand(t *testing.T) {
	out, err := run(t, "inspect", "--json", "../../testdata/models/tiny")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Tensors     []any `json:"tensors"`
		TotalParams int64 `json:"total_params"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Tensors) != 39 {
		t.Fatalf("inspect --json: %v, %d tensors", err, len(r.Tensors))
	}
	if _, err := run(t, "inspect", "/does/not/exist"); err == nil {
		t.Errorf("inspect of a missing path should fail")
	}
	if _, err := run(t, "inspect"); err == nil {
		t.Errorf("inspect without arguments should fail")
	}
}

func TestHelpEverywhere(t *testing.T) {
	app := newApp()
	for _, c := range app.Commands {
		out, err := run(t, c.Name, "--help")
		if err != nil || !strings.Contains(out, c.Name) {
			t.Errorf("%s --help: %v\n%s", c.Name, err, out)
		}
	}
	out, _ := run(t, "--version")
	if !strings.Contains(out, "qpack version") {
		t.Errorf("--version printed %q", out)
	}
}
