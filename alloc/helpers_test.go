package alloc

import (
	"fmt"
	"hash/fnv"
	"math"

	"github.com/qpack-dev/qpack/quant"
)

// gptqCost is the GPTQ layout's size: packed codes, F16 scales, packed zeros, int32 g_idx.
func gptqCost(s quant.Scheme, n, k int) int64 {
	groups := int64(s.Groups(k))
	codes := (int64(n)*int64(k)*int64(s.Bits) + 7) / 8
	zeros := (groups*int64(n)*int64(s.Bits) + 7) / 8
	return codes + groups*int64(n)*2 + zeros + int64(k)*4
}

// llamaInfos lists a Llama-shaped checkpoint: per block 7 linears and 2 norms, plus the
// embedding, the final norm and lm_head.
func llamaInfos(blocks, hidden, kv, mlp, vocab int) []TensorInfo {
	infos := []TensorInfo{
		{"model.embed_tokens.weight", []int{vocab, hidden}, "F16"},
		{"model.norm.weight", []int{hidden}, "F16"},
		{"lm_head.weight", []int{vocab, hidden}, "F16"},
	}
	for b := range blocks {
		p := fmt.Sprintf("model.layers.%d.", b)
		infos = append(infos,
			TensorInfo{p + "input_layernorm.weight", []int{hidden}, "F16"},
			TensorInfo{p + "post_attention_layernorm.weight", []int{hidden}, "F16"},
			TensorInfo{p + "self_attn.q_proj.weight", []int{hidden, hidden}, "F16"},
			TensorInfo{p + "self_attn.k_proj.weight", []int{kv, hidden}, "F16"},
			TensorInfo{p + "self_attn.v_proj.weight", []int{kv, hidden}, "F16"},
			TensorInfo{p + "self_attn.o_proj.weight", []int{hidden, hidden}, "F16"},
			TensorInfo{p + "mlp.gate_proj.weight", []int{mlp, hidden}, "F16"},
			TensorInfo{p + "mlp.up_proj.weight", []int{mlp, hidden}, "F16"},
			TensorInfo{p + "mlp.down_proj.weight", []int{hidden, mlp}, "F16"})
	}
	return infos
}

// synthMeasure is a cheap deterministic stand-in for a measured relative error: about 4^−bits
// (each bit halves the RMS error), scaled per tensor by a hash of its name, larger for bigger groups.
func synthMeasure(t TensorDesc, s quant.Scheme) (float64, error) {
	h := fnv.New32a()
	h.Write([]byte(t.Name))
	scale := 0.5 + float64(h.Sum32()%1000)/250
	g := 1.0
	if s.GroupSize == quant.PerChannel || s.GroupSize > 128 {
		g = 1.3
	}
	return scale * g * math.Pow(4, -float64(s.Bits)) * 0.3, nil
}

func mustDescribe(infos []TensorInfo) []TensorDesc {
	d, err := Describe(infos)
	if err != nil {
		panic(err)
	}
	return d
}

func mustScheme(name string) quant.Scheme {
	s, err := quant.ParseScheme(name)
	if err != nil {
		panic(err)
	}
	return s
}
