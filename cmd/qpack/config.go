package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	"go.yaml.in/yaml/v3"
)

// configFlag names a YAML (or JSON) file whose keys are the command's flag names, so a config
// file says exactly what flags say:
//
//	scheme: int4-g128-asym
//	format: qpack
//	strategy: budget
//	target-bpw: 3.5
//	override: ['mlp\.down_proj=int8-g128-asym', 'layers\.0\.=keep']
var configFlag = &cli.StringFlag{Name: "config", Usage: "YAML or JSON file of flag values (keys are flag names); flags on the command line win, list flags add to the file's"}

// applyConfig sets every flag the config file names that the command line did not; list flags
// (override) keep the command line's entries first and add the file's after them.
func applyConfig(c *cli.Context) error {
	path := c.String("config")
	if path == "" {
		return nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := applyValues(c, values); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// keyError is what is wrong with one key of a config file or a batch job.
type keyError struct {
	key string
	err error
}

func (e *keyError) Error() string { return e.key + ": " + e.err.Error() }
func (e *keyError) Unwrap() error { return e.err }

// applyValues sets the flags named by values' keys (a config file's, or a batch job's) as
// applyConfig says; an error is a keyError.
func applyValues(c *cli.Context, values map[string]any) error {
	known := map[string]cli.Flag{}
	for _, f := range c.Command.Flags {
		for _, n := range f.Names() {
			known[n] = f
		}
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		f, ok := known[key]
		if !ok || key == "config" {
			return &keyError{key, fmt.Errorf("not a flag of %s", c.Command.Name)}
		}
		_, isList := f.(*cli.StringSliceFlag)
		if c.IsSet(key) && !isList {
			continue
		}
		for _, v := range listOf(values[key]) {
			if err := c.Set(key, v); err != nil {
				return &keyError{key, err}
			}
		}
	}
	return nil
}

// listOf turns a YAML scalar or list into flag value strings.
func listOf(v any) []string {
	if list, ok := v.([]any); ok {
		out := make([]string, len(list))
		for i, e := range list {
			out[i] = fmt.Sprint(e)
		}
		return out
	}
	return []string{strings.TrimSpace(fmt.Sprint(v))}
}
