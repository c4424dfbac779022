package awq

import "github.com/qpack-dev/qpack/model"

// Pair is a group of linears that share one input, with the op before them that absorbs 1/s:
// an RMSNorm weight (Norm) or a linear whose output rows are the group's input channels (Prev).
type Pair struct {
	Group model.Group
	Norm  []float32
	Prev  *model.Linear
}

// Pairs lists what AWQ scales in a block (docs/reference/algorithms.md §2.3): input norm → q/k/v; v → o only
// when o's input is v's output channel for channel (no GQA), as AutoAWQ does; post-attention
// norm → gate/up; up → down.
func Pairs(b *model.Block) []Pair {
	pairs := []Pair{{Group: model.GroupQKV, Norm: b.InputNorm}}
	if b.V.Out == b.O.In {
		pairs = append(pairs, Pair{Group: model.GroupO, Prev: b.V})
	}
	return append(pairs, Pair{Group: model.GroupGateUp, Norm: b.PostAttnNorm}, Pair{Group: model.GroupDown, Prev: b.Up})
}

// Fold scales the pair's input channels by s: the preceding op's outputs (and bias) are divided
// by s and the group's weight columns multiplied by it, so the block computes the same function
// (in exact arithmetic). RMSNorm is y = x/rms(x)·w, linear in w, and q/k norms, rotary and the
// attention sit after the projections, so every family the engine has folds the same way.
func Fold(b *model.Block, p Pair, s []float32) {
	if p.Norm != nil {
		DivideRows(p.Norm, len(p.Norm), 1, s)
	} else {
		DivideRows(p.Prev.W, p.Prev.Out, p.Prev.In, s)
		if p.Prev.Bias != nil {
			DivideRows(p.Prev.Bias, p.Prev.Out, 1, s)
		}
	}
	for _, l := range b.Linears(p.Group) {
		ScaleColumns(l.W, l.Out, l.In, s)
	}
}
