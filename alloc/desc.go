// Package alloc chooses a precision for every tensor of a checkpoint: the evolved rules, a
// bit budget solved as a multiple-choice knapsack, user overrides, and an explanation of
// each choice.
package alloc

import (
	"fmt"
	"slices"
	"strings"

	"github.com/qpack-dev/qpack/model"
)

// TensorDesc describes one checkpoint tensor as the allocator sees it.
type TensorDesc struct {
	Name      string
	Role      model.Role
	Block     int // decoder block index, −1 outside the blocks
	NumBlocks int // decoder blocks in the model
	Shape     []int
	DType     string // safetensors dtype name: F32, F16, BF16, F8_E4M3, ...
	Params    int64
	// StoredBytes is what the output stores the tensor in when it is kept, when that is not its
	// input dtype (a GGUF file keeps norms in F32 and embeddings in a ggml type); 0: KeepBytes.
	StoredBytes int64
}

// TensorInfo is what a checkpoint header says about a tensor.
type TensorInfo struct {
	Name  string
	Shape []int
	DType string
}

// Describe classifies every tensor by name (model.ParseTensorName) and counts its parameters.
// The number of blocks is one more than the largest block index seen.
func Describe(infos []TensorInfo) ([]TensorDesc, error) {
	descs := make([]TensorDesc, 0, len(infos))
	seen := make(map[string]bool, len(infos))
	numBlocks := 0
	for _, in := range infos {
		if seen[in.Name] {
			return nil, fmt.Errorf("tensor %s: listed twice", in.Name)
		}
		seen[in.Name] = true
		if _, err := dtypeBytes(in.DType); err != nil {
			return nil, fmt.Errorf("tensor %s: %w", in.Name, err)
		}
		params := int64(1)
		for _, d := range in.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %s: negative dimension in shape %v", in.Name, in.Shape)
			}
			params *= int64(d)
		}
		parsed := model.ParseTensorName(in.Name)
		numBlocks = max(numBlocks, parsed.Block+1)
		descs = append(descs, TensorDesc{Name: in.Name, Role: parsed.Role, Block: parsed.Block,
			Shape: slices.Clone(in.Shape), DType: in.DType, Params: params})
	}
	for i := range descs {
		descs[i].NumBlocks = numBlocks
	}
	return descs, nil
}

// RelPos is the block's relative position, block/(NumBlocks−1): 0 for the first block, 1 for
// the last (0 when there is only one block). Meaningless outside the blocks (Block < 0).
func (t TensorDesc) RelPos() float64 { return t.edgeDistance(false) }

// isMatrix reports whether the tensor is a 2-D weight [N, K] that a scheme can be applied to.
func (t TensorDesc) isMatrix() bool {
	return len(t.Shape) == 2 && t.Shape[0] > 0 && t.Shape[1] > 0
}

// quantizable reports whether any scheme may ever be applied to the tensor: a 2-D linear,
// embedding or classifier weight. Norms, routers, biases and everything else never are.
func (t TensorDesc) quantizable() bool {
	return t.isMatrix() && (t.Role.IsLinear() || t.Role == model.RoleEmbedding || t.Role == model.RoleClassifier)
}

// keptBytes is the tensor's size in the output when it is kept.
func (t TensorDesc) keptBytes() int64 {
	if t.StoredBytes > 0 {
		return t.StoredBytes
	}
	return t.KeepBytes()
}

// KeepBytes is the tensor's size in its input dtype.
func (t TensorDesc) KeepBytes() int64 {
	b, _ := dtypeBytes(t.DType) // checked by Describe and Planner.check
	return t.Params * int64(b)
}

// dtypeBytes gives the element size of a safetensors dtype.
func dtypeBytes(dtype string) (int, error) {
	switch strings.ToUpper(dtype) {
	case "F64", "I64", "U64":
		return 8, nil
	case "F32", "I32", "U32":
		return 4, nil
	case "F16", "BF16", "I16", "U16":
		return 2, nil
	case "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "U8", "BOOL":
		return 1, nil
	}
	return 0, fmt.Errorf("unknown dtype %q", dtype)
}
