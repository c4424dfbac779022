package alloc

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/qpack-dev/qpack/model"
)

// Override pins every tensor whose name matches Pattern (an RE2 regular expression, matched
// anywhere in the name) to Choice. In a list, the first matching override wins.
type Override struct {
	Pattern string
	Choice  Choice
	re      *regexp.Regexp
}

// ParseOverride reads 'REGEX=SCHEME' (SCHEME is "keep" or a quant.ParseScheme name). The
// split is at the last '=', since scheme names never contain one.
func ParseOverride(spec string) (Override, error) {
	i := strings.LastIndexByte(spec, '=')
	if i <= 0 {
		return Override{}, fmt.Errorf("override %q: want REGEX=SCHEME", spec)
	}
	pattern := spec[:i]
	re, err := regexp.Compile(pattern)
	if err != nil {
		return Override{}, fmt.Errorf("override %q: bad regex: %w", spec, err)
	}
	c, err := ParseChoice(spec[i+1:])
	if err != nil {
		return Override{}, fmt.Errorf("override %q: %w", spec, err)
	}
	return Override{Pattern: pattern, Choice: c, re: re}, nil
}

// ParseOverrides reads a list of 'REGEX=SCHEME' specs, keeping their order.
func ParseOverrides(specs []string) ([]Override, error) {
	out := make([]Override, 0, len(specs))
	for _, s := range specs {
		o, err := ParseOverride(s)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// String gives the override back as 'REGEX=SCHEME'.
func (o Override) String() string { return o.Pattern + "=" + o.Choice.String() }

// pin is an override's verdict on one tensor.
type pin struct {
	choice Choice
	reason string
}

// resolvePins applies the overrides, first match wins, to every tensor. A scheme pinned on a
// tensor that can never be quantized (a norm, a router, a bias) is an error; an override that
// matches no tensor gives a warning.
func resolvePins(tensors []TensorDesc, overrides []Override) (map[string]pin, []string, error) {
	res := make([]*regexp.Regexp, len(overrides))
	for i, o := range overrides {
		res[i] = o.re
		if o.re == nil { // built as a literal rather than by ParseOverride
			re, err := regexp.Compile(o.Pattern)
			if err != nil {
				return nil, nil, fmt.Errorf("override %q: bad regex: %w", o, err)
			}
			res[i] = re
		}
	}
	pins := map[string]pin{}
	used := make([]bool, len(overrides))
	for _, t := range tensors {
		for i, o := range overrides {
			if !res[i].MatchString(t.Name) {
				continue
			}
			used[i] = true
			if !o.Choice.Keep && !t.quantizable() {
				return nil, nil, fmt.Errorf("override %q matches %s, a %s tensor, which is never quantized; "+
					"narrow the regex (e.g. to the *_proj weights)", o, t.Name, roleWord(t))
			}
			pins[t.Name] = pin{o.Choice, fmt.Sprintf("override /%s/ → %s", o.Pattern, o.Choice)}
			break
		}
	}
	var warnings []string
	for i, o := range overrides {
		if !used[i] {
			warnings = append(warnings, fmt.Sprintf("override %q matches no tensor", o))
		}
	}
	return pins, warnings, nil
}

// roleWord names what kind of tensor t is, for messages.
func roleWord(t TensorDesc) string {
	switch {
	case t.Role == model.RoleNorm:
		return "norm"
	case t.Role == model.RoleRouter:
		return "MoE router"
	case !t.isMatrix():
		return fmt.Sprintf("%d-D (shape %v)", len(t.Shape), t.Shape)
	}
	return t.Role.String()
}
