package convert

import (
	"fmt"
	"math"
	"strings"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// sharedGlobalScales gives the NVFP4 linears that vLLM fuses into one layer — q, k and v; gate
// and up (of each expert) — one global scale, that of the largest weight among them, as
// llm-compressor does (update_fused_layer_weight_global_scales): vLLM loads a fused layer with
// one global scale and warns that differing ones lose accuracy (docs/fp4.md). Only the
// compressed-tensors layout, which vLLM loads, gets them; other layouts keep one global scale
// per tensor. It reads each NVFP4 weight once for its largest |w|.
func sharedGlobalScales(ck *safetensors.Checkpoint, items []Item, f packing.Format) (map[string]float32, error) {
	if _, ok := f.(packing.CompressedTensors); !ok {
		return nil, nil
	}
	amax := map[string]float32{} // by fused layer
	fused := map[string]string{} // module → its fused layer
	for _, it := range items {
		if it.Scheme == nil || it.Scheme.Grid != quant.NVFP4 {
			continue
		}
		w, err := ck.Float32(it.Info.Name)
		if err != nil {
			return nil, err
		}
		if i := fp.FirstNonFinite(w); i >= 0 {
			return nil, fmt.Errorf("tensor %s: weight at row %d, column %d is %g", it.Info.Name, i/it.K(), i%it.K(), w[i])
		}
		layer := fusedLayer(it)
		fused[it.Module] = layer
		for _, v := range w {
			amax[layer] = max(amax[layer], float32(math.Abs(float64(v))))
		}
		ck.Release(it.Info.Name)
	}
	globals := map[string]float32{}
	for module, layer := range fused {
		globals[module] = quant.NVFP4GlobalScale(amax[layer])
	}
	return globals, nil
}

// fusedLayer names the layer vLLM fuses the item's linear into: its attention's qkv_proj, its
// MLP's (or expert's) gate_up_proj, or the linear itself.
func fusedLayer(it Item) string {
	parent := it.Module[:max(strings.LastIndexByte(it.Module, '.'), 0)]
	switch model.ParseTensorName(it.Info.Name).Role {
	case model.RoleAttnQ, model.RoleAttnK, model.RoleAttnV:
		return parent + ".qkv_proj"
	case model.RoleMLPGate, model.RoleMLPUp:
		return parent + ".gate_up_proj"
	}
	return it.Module
}
