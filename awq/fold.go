package awq

import "github.com/qpack-dev/qpack/model"

// Pair is a group of linears that share one input, with the op before them that absorbs 1/s:
// an RMSNorm weight (Norm) or a linear whose output rows are the group's input channels (Prev).
// Also lists more groups that read the same input (Group's, or rows of it) and so are scaled
// with it: the experts' gate/up behind a mixture of experts' post-attention norm.
type Pair struct {
	Group model.Group
	Also  []model.Group
	Norm  []float32
	Prev  *model.Linear
}

// Groups is the pair's group followed by Also.
func (p Pair) Groups() []model.Group { return append([]model.Group{p.Group}, p.Also...) }

// Pairs lists what AWQ scales in a block (docs/reference/algorithms.md §2.3): input norm →
// q/k/v; v → o only when o's input is v's output channel for channel (no GQA), as AutoAWQ does;
// post-attention norm → gate/up; up → down. In a mixture of experts the post-attention norm
// scales the router, the shared expert's gate/up and every expert's gate/up with one scale (as
// AutoAWQ's Mixtral does), and each expert's up scales its own down.
func Pairs(b *model.Block) []Pair {
	pairs := []Pair{{Group: model.GroupQKV, Norm: b.InputNorm}}
	if b.V.Out == b.O.In {
		pairs = append(pairs, Pair{Group: model.GroupO, Prev: b.V})
	}
	if b.MoE == nil {
		return append(pairs, Pair{Group: model.GroupGateUp, Norm: b.PostAttnNorm}, Pair{Group: model.GroupDown, Prev: b.Up})
	}
	gateUp := Pair{Group: model.GroupGateUp, Norm: b.PostAttnNorm}
	for e := range b.MoE.Experts {
		gateUp.Also = append(gateUp.Also, model.ExpertGateUp(e))
	}
	pairs = append(pairs, gateUp)
	for e, x := range b.MoE.Experts {
		pairs = append(pairs, Pair{Group: model.ExpertDown(e), Prev: x.Up})
	}
	if sh := b.MoE.Shared; sh != nil {
		pairs = append(pairs, Pair{Group: model.GroupDown, Prev: sh.Up})
	}
	return pairs
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
	for _, g := range p.Groups() {
		for _, l := range b.Linears(g) {
			ScaleColumns(l.W, l.Out, l.In, s)
		}
	}
}

// FoldOnGPU is Fold on the copy of the block that engine e is calibrating (from a calibrator's
// Update), rounding every value as Fold does: Fold on the host and FoldOnGPU leave the two copies
// equal, bit for bit, and the engine need not upload the folded weights (model.GPU.KeepDeviceWeights).
func FoldOnGPU(e *model.GPU, b *model.Block, p Pair, s []float32) error {
	var err error
	if p.Norm != nil {
		err = e.DivideNorm(p.Norm, s)
	} else {
		err = e.DivideLinearRows(p.Prev, s)
	}
	if err != nil {
		return err
	}
	for _, g := range p.Groups() {
		for _, l := range b.Linears(g) {
			if err := e.ScaleColumns(l, s); err != nil {
				return err
			}
		}
	}
	return nil
}
