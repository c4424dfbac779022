package ggufexport

import (
	"fmt"
	"io"
	"strings"

	"github.com/qpack-dev/qpack/gguf"
)

// merged plans a merged expert tensor [Experts, N, K]: each expert planned as its own linear
// (repacked losslessly from its quantized module, or a float weight encoded in --type), written
// one after the other. ggml holds the tensor in one type, so the experts' types must agree; when
// they do not (a budget plan gave the experts of a block different schemes), --requantize
// dequantizes every expert and quantizes it again to --type.
func (p *planner) merged(r role) (gguf.Tensor, string, error) {
	parts := make([]gguf.Tensor, len(r.experts))
	hows := map[string]bool{}
	for e, hf := range r.experts {
		t, how, err := p.tensor(role{gguf: r.gguf, hf: hf, linear: true})
		if err != nil {
			return gguf.Tensor{}, "", fmt.Errorf("expert %d of %s: %w", e, r.gguf, err)
		}
		if len(t.Dims) != 2 || (e > 0 && (t.Dims[0] != parts[0].Dims[0] || t.Dims[1] != parts[0].Dims[1])) {
			return gguf.Tensor{}, "", fmt.Errorf("%s: expert %d (%s) has dims %v, expert 0 %v", r.gguf, e, hf, t.Dims, parts[0].Dims)
		}
		parts[e] = t
		hows[how] = true
	}
	for e, t := range parts {
		if t.Type == parts[0].Type {
			continue
		}
		if !p.opts.Requantize {
			return gguf.Tensor{}, "", fmt.Errorf("%s: expert 0 (%s) would be stored as %s and expert %d (%s) as %s, but llama.cpp holds a block's experts in one tensor of one type; --requantize stores them all as --type %s",
				r.gguf, r.experts[0], parts[0].Type, e, r.experts[e], t.Type, p.linear)
		}
		return p.requantizedExperts(r)
	}
	var how []string
	for h := range hows {
		how = append(how, h)
	}
	return concatExperts(r.gguf, parts), strings.Join(how, "; ") + fmt.Sprintf(" (%d experts)", len(parts)), nil
}

// requantizedExperts stores every expert of r as --type from its float (or dequantized) weight.
func (p *planner) requantizedExperts(r role) (gguf.Tensor, string, error) {
	parts := make([]gguf.Tensor, len(r.experts))
	for e, hf := range r.experts {
		shape, _ := p.c.Shape(hf)
		er := role{gguf: r.gguf, hf: hf, linear: true}
		if err := checkRows(er, shape, p.linear); err != nil {
			return gguf.Tensor{}, "", err
		}
		parts[e] = lazyFloatTensor(er, p.linear, shape, func() ([]float32, error) { return p.c.Float32(hf) })
	}
	return concatExperts(r.gguf, parts), fmt.Sprintf("dequantized and requantized (lossy: the experts' schemes differ) (%d experts)", len(parts)), nil
}

// concatExperts writes the experts' tensors one after the other as one [Experts, N, K] tensor.
func concatExperts(name string, parts []gguf.Tensor) gguf.Tensor {
	d := parts[0].Dims
	return gguf.Tensor{Name: name, Type: parts[0].Type, Dims: []uint64{d[0], d[1], uint64(len(parts))},
		WriteTo: func(w io.Writer) error {
			for e, t := range parts {
				if err := t.WriteTo(w); err != nil {
					return fmt.Errorf("expert %d: %w", e, err)
				}
			}
			return nil
		}}
}
