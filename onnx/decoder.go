package onnx

import (
	"fmt"
	"math"
	"strconv"

	"github.com/qpack-dev/qpack/model"
)

// Graph inputs and outputs, named as onnxruntime-genai's decoder models name them.
const (
	inputIDs      = "input_ids"
	attentionMask = "attention_mask"
	positionIDs   = "position_ids"
	logitsName    = "logits"
)

// PastKey, PastValue, PresentKey and PresentValue name layer i's KV cache tensors
// [batch, kv_heads, sequence, head_dim].
func PastKey(i int) string      { return "past_key_values." + strconv.Itoa(i) + ".key" }
func PastValue(i int) string    { return "past_key_values." + strconv.Itoa(i) + ".value" }
func PresentKey(i int) string   { return "present." + strconv.Itoa(i) + ".key" }
func PresentValue(i int) string { return "present." + strconv.Itoa(i) + ".value" }

var (
	batch   = Dim{Param: "batch_size"}
	seq     = Dim{Param: "sequence_length"}
	pastSeq = Dim{Param: "past_sequence_length"}
	total   = Dim{Param: "total_sequence_length"}
)

// decoder writes the whole decoder graph: embeddings, the blocks with their KV cache, the
// final norm and lm_head.
func (e *exporter) decoder() error {
	c, g := e.cfg, e.g
	kvDims := func(s Dim) []Dim {
		return []Dim{batch, {Value: int64(c.KVHeads)}, s, {Value: int64(c.HeadDim)}}
	}
	g.Input(inputIDs, Int64, batch, seq)
	g.Input(attentionMask, Int64, batch, total)
	g.Input(positionIDs, Int64, batch, seq)
	for i := range c.Layers {
		g.Input(PastKey(i), Float, kvDims(pastSeq)...)
		g.Input(PastValue(i), Float, kvDims(pastSeq)...)
	}
	g.Output(logitsName, Float, batch, seq, Dim{Value: int64(c.Vocab)})
	for i := range c.Layers {
		g.Output(PresentKey(i), Float, kvDims(total)...)
		g.Output(PresentValue(i), Float, kvDims(total)...)
	}

	embed, err := e.plainInit("model.embed_tokens.weight", c.Vocab, c.Hidden)
	if err != nil {
		return err
	}
	x := g.Op("Gather", []string{embed, inputIDs}, IntAttr("axis", 0))
	cos, sin, err := e.rotary()
	if err != nil {
		return err
	}
	masks := map[int]string{}
	for i := range c.Layers {
		w := c.SlidingWindow[i]
		if _, ok := masks[w]; !ok {
			masks[w] = e.mask(w)
		}
		if x, err = e.block(i, x, cos, sin, masks[w]); err != nil {
			return err
		}
	}
	if x, err = e.rmsNorm(x, "model.norm.weight", c.Hidden); err != nil {
		return err
	}
	head := "lm_head"
	if _, ok := e.ck.Shape("lm_head.weight"); !ok && c.TieEmbeddings {
		// Tied: the logits read the embedding matrix, transposed once when the session loads.
		y := g.Op("MatMul", []string{x, g.Op("Transpose", []string{embed}, IntsAttr("perm", 1, 0))})
		g.OpTo("Identity", "", []string{y}, []string{logitsName})
		return nil
	}
	y, err := e.linear(x, head, c.Vocab, c.Hidden)
	if err != nil {
		return err
	}
	g.OpTo("Identity", "", []string{y}, []string{logitsName})
	return nil
}

// plainInit writes a tensor as a FLOAT value of shape [rows, cols] (a quantized module's
// weight dequantized), checking its shape and values.
func (e *exporter) plainInit(name string, rows, cols int) (string, error) {
	w, err := e.floatTensor(name, rows, cols)
	if err != nil {
		return "", err
	}
	return e.floatInit(name, w, int64(rows), int64(cols))
}

// floatTensor reads a logical tensor as float32, checking its shape and that it is finite.
func (e *exporter) floatTensor(name string, dims ...int) ([]float32, error) {
	shape, ok := e.ck.Shape(name)
	if !ok {
		return nil, fmt.Errorf("%s: tensor %s not found", e.src, name)
	}
	if fmt.Sprint(shape) != fmt.Sprint(dims) {
		return nil, fmt.Errorf("%s: tensor %s has shape %v, want %v", e.src, name, shape, dims)
	}
	w, err := e.ck.Float32(name)
	if err != nil {
		return nil, err
	}
	for i, v := range w {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%s: tensor %s has a non-finite value %v at index %d", e.src, name, v, i)
		}
	}
	return w, nil
}

// rotary returns cos and sin [batch, 1, seq, head_dim/2] of position_ids · inv_freq.
func (e *exporter) rotary() (cos, sin string, err error) {
	g := e.g
	inv, err := g.Float32s("rotary.inv_freq", model.RopeInvFreq(e.cfg), int64(e.cfg.HeadDim/2))
	if err != nil {
		return "", "", err
	}
	pos := g.Op("Cast", []string{positionIDs}, IntAttr("to", Float))
	angle := g.Op("Mul", []string{g.Op("Unsqueeze", []string{pos, g.Int64s(2)}), inv}) // [B, S, D/2]
	angle = g.Op("Unsqueeze", []string{angle, g.Int64s(1)})                            // [B, 1, S, D/2]
	return g.Op("Cos", []string{angle}), g.Op("Sin", []string{angle}), nil
}

// mask returns the additive attention bias [batch, 1, 1, seq, total]: 0 where query position
// past+s may see key position t (t ≤ past+s, within the window when window > 0, and
// attention_mask[t] = 1), the lowest float32 elsewhere.
func (e *exporter) mask(window int) string {
	g := e.g
	past := g.Op("Shape", []string{PastKey(0)}, IntAttr("start", 2), IntAttr("end", 3))
	s := g.Op("Shape", []string{inputIDs}, IntAttr("start", 1), IntAttr("end", 2))
	tot := g.Op("Add", []string{past, s})
	one := g.Int64Scalar(1)
	qPos := g.Op("Range", []string{g.Op("Squeeze", []string{past}), g.Op("Squeeze", []string{tot}), one})
	kPos := g.Op("Range", []string{g.Int64Scalar(0), g.Op("Squeeze", []string{tot}), one})
	q := g.Op("Unsqueeze", []string{qPos, g.Int64s(1)}) // [S, 1]
	k := g.Op("Unsqueeze", []string{kPos, g.Int64s(0)}) // [1, T]
	allowed := g.Op("LessOrEqual", []string{k, q})
	if window > 0 {
		near := g.Op("Less", []string{g.Op("Sub", []string{q, k}), g.Int64s(int64(window))})
		allowed = g.Op("And", []string{allowed, near})
	}
	pad := g.Op("Cast", []string{attentionMask}, IntAttr("to", Bool))
	pad = g.Op("Unsqueeze", []string{pad, g.Int64s(1, 2, 3)})
	allowed = g.Op("And", []string{pad, allowed})
	return g.Op("Where", []string{allowed, g.Scalar(0), g.Scalar(-math.MaxFloat32)})
}

// rmsNorm is x·rsqrt(mean(x²) + eps)·weight over the last axis.
func (e *exporter) rmsNorm(x, weight string, dim int) (string, error) {
	g := e.g
	w, err := e.floatTensor(weight, dim)
	if err != nil {
		return "", err
	}
	wName, err := g.Float32s(weight, w, int64(dim))
	if err != nil {
		return "", err
	}
	ms := g.Op("ReduceMean", []string{g.Op("Mul", []string{x, x}), g.Int64s(-1)}, IntAttr("keepdims", 1))
	inv := g.Op("Reciprocal", []string{g.Op("Sqrt", []string{g.Op("Add", []string{ms, g.Scalar(float32(e.cfg.RMSNormEps))})})})
	return g.Op("Mul", []string{wName, g.Op("Mul", []string{x, inv})}), nil
}

// rope rotates x [batch, heads, seq, head_dim] with rotate_half's pairs (i, i + head_dim/2).
func (e *exporter) rope(x, cos, sin string) string {
	g := e.g
	half := int64(e.cfg.HeadDim / 2)
	lo := g.Op("Slice", []string{x, g.Int64s(0), g.Int64s(half), g.Int64s(-1)})
	hi := g.Op("Slice", []string{x, g.Int64s(half), g.Int64s(2 * half), g.Int64s(-1)})
	newLo := g.Op("Sub", []string{g.Op("Mul", []string{lo, cos}), g.Op("Mul", []string{hi, sin})})
	newHi := g.Op("Add", []string{g.Op("Mul", []string{hi, cos}), g.Op("Mul", []string{lo, sin})})
	return g.Op("Concat", []string{newLo, newHi}, IntAttr("axis", -1))
}

// block writes decoder block i on the hidden states x [batch, seq, hidden].
func (e *exporter) block(i int, x, cos, sin, mask string) (string, error) {
	c, g := e.cfg, e.g
	p := "model.layers." + strconv.Itoa(i) + "."
	H, KV, D := int64(c.Heads), int64(c.KVHeads), int64(c.HeadDim)
	h, err := e.rmsNorm(x, p+"input_layernorm.weight", c.Hidden)
	if err != nil {
		return "", err
	}
	proj := map[string]string{}
	for _, m := range []struct {
		name  string
		heads int64
	}{{"q_proj", H}, {"k_proj", KV}, {"v_proj", KV}} {
		y, err := e.linear(h, p+"self_attn."+m.name, int(m.heads*D), c.Hidden)
		if err != nil {
			return "", err
		}
		y = g.Op("Reshape", []string{y, g.Int64s(0, 0, m.heads, D)}) // [B, S, heads, D]
		if c.QKNorm && m.name != "v_proj" {
			if y, err = e.rmsNorm(y, p+"self_attn."+m.name[:1]+"_norm.weight", c.HeadDim); err != nil {
				return "", err
			}
		}
		proj[m.name] = g.Op("Transpose", []string{y}, IntsAttr("perm", 0, 2, 1, 3)) // [B, heads, S, D]
	}
	q := e.rope(proj["q_proj"], cos, sin)
	k := e.rope(proj["k_proj"], cos, sin)
	g.OpTo("Concat", "", []string{PastKey(i), k}, []string{PresentKey(i)}, IntAttr("axis", 2))
	g.OpTo("Concat", "", []string{PastValue(i), proj["v_proj"]}, []string{PresentValue(i)}, IntAttr("axis", 2))
	// GQA: query head h reads kv head h / (H/KV); group the queries per kv head and let MatMul
	// broadcast the keys and values over the group.
	qg := g.Op("Reshape", []string{q, g.Int64s(0, KV, H/KV, -1, D)})      // [B, KV, G, S, D]
	kt := g.Op("Unsqueeze", []string{PresentKey(i), g.Int64s(2)})         // [B, KV, 1, T, D]
	kt = g.Op("Transpose", []string{kt}, IntsAttr("perm", 0, 1, 2, 4, 3)) // [B, KV, 1, D, T]
	scores := g.Op("Mul", []string{g.Op("MatMul", []string{qg, kt}), g.Scalar(float32(1 / math.Sqrt(float64(D))))})
	probs := g.Op("Softmax", []string{g.Op("Add", []string{scores, mask})}, IntAttr("axis", -1))
	v := g.Op("Unsqueeze", []string{PresentValue(i), g.Int64s(2)})
	a := g.Op("MatMul", []string{probs, v})                          // [B, KV, G, S, D]
	a = g.Op("Reshape", []string{a, g.Int64s(0, H, -1, D)})          // [B, H, S, D]
	a = g.Op("Transpose", []string{a}, IntsAttr("perm", 0, 2, 1, 3)) // [B, S, H, D]
	a = g.Op("Reshape", []string{a, g.Int64s(0, 0, -1)})             // [B, S, H·D]
	o, err := e.linear(a, p+"self_attn.o_proj", c.Hidden, int(H*D))
	if err != nil {
		return "", err
	}
	x = g.Op("Add", []string{x, o})
	if h, err = e.rmsNorm(x, p+"post_attention_layernorm.weight", c.Hidden); err != nil {
		return "", err
	}
	gate, err := e.linear(h, p+"mlp.gate_proj", c.Intermediate, c.Hidden)
	if err != nil {
		return "", err
	}
	up, err := e.linear(h, p+"mlp.up_proj", c.Intermediate, c.Hidden)
	if err != nil {
		return "", err
	}
	act := g.Op("Mul", []string{g.Op("Mul", []string{gate, g.Op("Sigmoid", []string{gate})}), up})
	down, err := e.linear(act, p+"mlp.down_proj", c.Hidden, c.Intermediate)
	if err != nil {
		return "", err
	}
	return g.Op("Add", []string{x, down}), nil
}
