package convert

import (
	"fmt"
	"strings"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/gptq"
	"github.com/qpack-dev/qpack/quant"
)

// Method is a quantization method. It owns what it needs (calibration data), which schemes it
// can produce with which options, and its defaults, so that the CLI, batch jobs and library
// callers get the same policy.
type Method string

const (
	// RTN is block-wise round-to-nearest: no data needed, every scheme.
	RTN Method = "rtn"
	// GPTQ runs the model block by block over calibration data and quantizes each linear with
	// second-order error feedback: integer, NF4, FP4 and k-quant grids.
	GPTQ Method = "gptq"
	// AWQ searches activation-aware scales per group of linears, folds them into the previous
	// op, clips and rounds: integer grids.
	AWQ Method = "awq"
	// AWQGPTQ folds AWQ's scales, then runs GPTQ on the scaled model: integer grids and the IQ
	// types.
	AWQGPTQ Method = "awq+gptq"
)

// Methods lists every method, in the order help texts name them.
var Methods = []Method{RTN, GPTQ, AWQ, AWQGPTQ}

// ParseMethod reads a method's name.
func ParseMethod(name string) (Method, error) {
	for _, m := range Methods {
		if string(m) == name {
			return m, nil
		}
	}
	names := make([]string, len(Methods))
	for i, m := range Methods {
		names[i] = string(m)
	}
	return "", fmt.Errorf("method %q is not available (available: %s)", name, strings.Join(names, ", "))
}

func (m Method) String() string { return string(m) }

// Calibrates says whether the method runs the model block by block over calibration data
// (and so needs it).
func (m Method) Calibrates() bool { return m != RTN }

// Scales says whether the method searches and folds AWQ's activation-aware scales.
func (m Method) Scales() bool { return m == AWQ || m == AWQGPTQ }

// Solves says whether GPTQ quantizes the linears.
func (m Method) Solves() bool { return m == GPTQ || m == AWQGPTQ }

// DefaultOptions are DefaultOptions() with this method and the settings it changes: awq+gptq
// fits GPTQ's groups with the imatrix search, which stands in for AWQ's clipping search (that
// cannot run before GPTQ: clipped weights would become GPTQ's target; docs/convert.md).
func (m Method) DefaultOptions() Options {
	o := DefaultOptions()
	o.Method = m
	o.Imatrix = m == AWQGPTQ
	return o
}

// Takes says whether the method, with opt's settings, can quantize a tensor to scheme s;
// the error says why not. Row lengths are checked per tensor later.
func (m Method) Takes(s quant.Scheme, opt Options) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if m.Scales() && s.Grid != quant.Integer && (m != AWQGPTQ || s.Grid != quant.IQuant) {
		return fmt.Errorf("%s quantizes to integer grids%s, not %s (use --method gptq or rtn for it)", m, map[bool]string{true: " and the IQ types"}[m == AWQGPTQ], s)
	}
	if m.Solves() {
		return gptq.Takes(s, opt.gptq())
	}
	if m == RTN {
		return blockwise.Takes(s, opt.blockwise(""))
	}
	return nil
}
