package alloc

import (
	"fmt"
	"strings"

	"github.com/qpack-dev/qpack/quant"
)

// KeepName is the scheme name of a tensor left in its input dtype.
const KeepName = "keep"

// Choice is one rung of the precision ladder: a quant.Scheme, or Keep (the input dtype, not
// quantized).
type Choice struct {
	Keep   bool
	Scheme quant.Scheme // meaningful when !Keep
}

// Keep is the choice that leaves a tensor in its input dtype.
var Keep = Choice{Keep: true}

// SchemeChoice is the choice of quantizing with s.
func SchemeChoice(s quant.Scheme) Choice { return Choice{Scheme: s} }

// String is "keep" or the scheme's canonical name.
func (c Choice) String() string {
	if c.Keep {
		return KeepName
	}
	return c.Scheme.String()
}

// ParseChoice reads "keep" or a scheme name understood by quant.ParseScheme.
func ParseChoice(name string) (Choice, error) {
	if strings.EqualFold(strings.TrimSpace(name), KeepName) {
		return Keep, nil
	}
	s, err := quant.ParseScheme(name)
	if err != nil {
		return Choice{}, err
	}
	return SchemeChoice(s), nil
}

// ParseLadder reads comma-separated rungs, lowest precision first, e.g.
// "int2-g128-sym,int4-g128-sym,int8-g128-sym,keep".
func ParseLadder(list string) ([]Choice, error) {
	var ladder []Choice
	for _, part := range strings.Split(list, ",") {
		c, err := ParseChoice(part)
		if err != nil {
			return nil, fmt.Errorf("ladder %q: %w", list, err)
		}
		ladder = append(ladder, c)
	}
	return ladder, checkLadder(ladder)
}

// checkLadder refuses an empty ladder, repeated rungs and "keep" anywhere but at the top.
func checkLadder(ladder []Choice) error {
	if len(ladder) == 0 {
		return fmt.Errorf("empty precision ladder")
	}
	seen := map[string]bool{}
	for i, c := range ladder {
		if seen[c.String()] {
			return fmt.Errorf("ladder lists %s twice", c)
		}
		seen[c.String()] = true
		if c.Keep && i != len(ladder)-1 {
			return fmt.Errorf("ladder: keep must be the highest rung")
		}
		if !c.Keep {
			if err := c.Scheme.Validate(); err != nil {
				return fmt.Errorf("ladder: %w", err)
			}
		}
	}
	return nil
}

func mustLadder(list string) []Choice {
	l, err := ParseLadder(list)
	if err != nil {
		panic(err) // only for the package's own constant defaults
	}
	return l
}

// QPackLadder is the budget ladder for format qpack, which holds every scheme: asymmetric
// integer grids from 2 to 8 bits at several group sizes, NF4 groups, llama.cpp's k-quants
// q2_k … q6_k and the FP4 grids mxfp4 (4.25 bits) and nvfp4 (4.5 bits and 32 per tensor), in
// bits-per-weight order. A method that cannot produce a rung leaves it out (convert's
// Method.Takes), and a k-quant or FP4 rung is offered only to tensors whose rows hold whole
// sub-blocks or blocks. On the shared small-llama, GPTQ budget plans over the whole ladder are
// lower in perplexity than over the integer rungs alone (docs/results.md).
func QPackLadder() []Choice {
	return mustLadder("int2-g64-asym,int2-g32-asym,q2_k,int3-g128-asym,int3-g64-asym,q3_k,int3-g32-asym," +
		"nf4-g128,int4-g128-asym,nf4-g64,mxfp4,int4-g64-asym,nf4-g32,nvfp4,q4_k,int4-g32-asym," +
		"int5-g128-asym,int5-g64-asym,q5_k,int6-g128-asym,q6_k,int8-g128-asym")
}

// DefaultLadder is the ladder a strategy uses when Options.Ladder is empty. GPTQ-style
// symmetric group-128 schemes, which the default output format and common kernels load.
func DefaultLadder(strategy string) []Choice {
	switch strategy {
	case StrategyUniform:
		return mustLadder("int4-g128-sym")
	case StrategyEvolved:
		return mustLadder("int4-g128-sym,int8-g128-sym")
	default:
		return mustLadder("int2-g128-sym,int3-g128-sym,int4-g128-sym,int8-g128-sym,keep")
	}
}
