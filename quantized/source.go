package quantized

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/safetensors"
)

// OpenSource opens the checkpoint at path as float weights to quantize, the way convert reads
// its input. A block FP8 release (DeepSeek-V3, Qwen3-FP8: quant_method fp8 with
// weight_block_size) reads with each quantized module's "<module>.weight" as an F32 tensor of
// its exact weights, e4m3(q)·scale of its block, dequantized whenever it is read, and its
// weight_scale_inv left out of the names; a weight whose scales are missing or mis-shaped is an
// error naming it. Every other checkpoint reads as stored.
func OpenSource(path string) (*safetensors.Checkpoint, error) {
	c, err := Open(path)
	if err != nil {
		return nil, err
	}
	if _, ok := c.Format.(packing.FP8Block); !ok {
		return c.Checkpoint, nil
	}
	for _, prefix := range c.mods {
		if err := c.substituteDequantized(prefix); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c.Checkpoint, nil
}

// substituteDequantized makes module prefix's weight read as its F32 dequantization, after
// checking from the headers that its codes and scales have the dtypes and shapes of its scheme.
func (c *Checkpoint) substituteDequantized(prefix string) error {
	m, err := c.Module(prefix)
	if err != nil {
		return err
	}
	name, scales := prefix+".weight", prefix+".weight_scale_inv"
	codes, _ := c.Checkpoint.Info(name)
	sc, _ := c.Checkpoint.Info(scales)
	b := m.Scheme.GroupSize
	if want := []int{(m.N + b - 1) / b, (m.K + b - 1) / b}; sc.DType != safetensors.F32 || !slices.Equal(sc.Shape, want) {
		return fmt.Errorf("%s: tensor %s is %s%v; the %dx%d weight %s with %d×%d blocks needs F32%v", c.Dir, scales, sc.DType, sc.Shape, m.N, m.K, name, b, b, want)
	}
	if codes.DType != safetensors.F8E4M3 {
		return fmt.Errorf("%s: tensor %s is %s, want F8_E4M3 (its scales are %s)", c.Dir, name, codes.DType, scales)
	}
	info := safetensors.TensorInfo{Name: name, DType: safetensors.F32, Shape: []int{m.N, m.K}, File: codes.File, Size: 4 * int64(m.N) * int64(m.K)}
	read := func(dst []byte) error {
		t, err := c.Unpack(prefix)
		if err != nil {
			return err
		}
		for i, v := range t.Dequantize(nil) {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
		return nil
	}
	return c.Checkpoint.Substitute(safetensors.Virtual{Info: info, Read: read}, scales)
}
