package convert

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/internal/staged"
	"github.com/qpack-dev/qpack/quantized"
	"github.com/qpack-dev/qpack/safetensors"
)

// Dequantize writes a plain checkpoint from a quantized one (a GGUF file: ggufexport.Dequantize): every quantized module becomes
// "<module>.weight" in dtype (F16, BF16 or F32), the other tensors are copied as stored, and
// config.json loses its quantization_config, so any tool can load and evaluate the result.
func Dequantize(src, dst string, dtype safetensors.DType, overwrite bool) error {
	if ggufexport.IsGGUF(src) {
		return ggufexport.Dequantize(src, dst, dtype, overwrite, 0)
	}
	if dtype != safetensors.F16 && dtype != safetensors.BF16 && dtype != safetensors.F32 {
		return fmt.Errorf("dequantize: dtype %s is not one of F16, BF16, F32", dtype)
	}
	if err := staged.CheckDestination(dst, overwrite); err != nil {
		return err
	}
	c, err := quantized.Open(src)
	if err != nil {
		return err
	}
	defer c.Close()
	if c.Format == nil {
		return fmt.Errorf("%s is not quantized (no quantization config and no packed tensors)", src)
	}
	shards, err := dequantizedTensors(c, dtype)
	if err != nil {
		return err
	}
	return staged.Dir(dst, overwrite, nil, func(dir string) error {
		if _, err := safetensors.WriteShards(dir, shards, map[string]string{"qpack.dequantized_from": c.Format.Name()}); err != nil {
			return err
		}
		if err := writePlainConfig(c.Dir, dir); err != nil {
			return err
		}
		return copyAuxFiles(c.Dir, dir, io.Discard)
	})
}

// dequantizedTensors lists the output per input shard, a module taking the place of its
// first stored tensor. Each module is unpacked once here for its shape and again when written,
// so that only one module is held in memory at a time.
func dequantizedTensors(c *quantized.Checkpoint, dtype safetensors.DType) ([][]safetensors.WriterTensor, error) {
	var shards [][]safetensors.WriterTensor
	for _, h := range c.Headers() {
		var shard []safetensors.WriterTensor
		for _, info := range h.Tensors {
			prefix, owned := c.Owner(info.Name)
			switch {
			case !owned:
				shard = append(shard, mappedTensor(c.Checkpoint, info))
			case info.Name == c.Format.TensorNames(prefix)[0]:
				shape, ok := c.Shape(prefix + ".weight")
				if !ok {
					_, err := c.Unpack(prefix)
					return nil, err
				}
				shard = append(shard, safetensors.WriterTensor{Name: prefix + ".weight", DType: dtype, Shape: shape,
					WriteTo: func(w io.Writer) error {
						v, err := c.Float32(prefix + ".weight")
						if err != nil {
							return err
						}
						_, err = w.Write(encodeFloats(v, dtype))
						return err
					}})
			}
		}
		if len(shard) > 0 {
			shards = append(shards, shard)
		}
	}
	return shards, nil
}

// mappedTensor streams an input tensor unchanged from the mapped file.
func mappedTensor(ck *safetensors.Checkpoint, info safetensors.TensorInfo) safetensors.WriterTensor {
	return safetensors.WriterTensor{Name: info.Name, DType: info.DType, Shape: info.Shape,
		WriteTo: func(w io.Writer) error {
			b, err := ck.Bytes(info.Name)
			if err != nil {
				return err
			}
			_, err = w.Write(b)
			ck.Release(info.Name)
			return err
		}}
}

// encodeFloats stores float32 values as little-endian F16, BF16 or F32 (rounding to nearest even).
func encodeFloats(v []float32, dtype safetensors.DType) []byte {
	return safetensors.EncodeFloat32(dtype, v)
}

// writePlainConfig copies config.json without its quantization_config.
func writePlainConfig(src, dst string) error {
	b, err := os.ReadFile(filepath.Join(src, "config.json"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: invalid JSON: %w", filepath.Join(src, "config.json"), err)
	}
	delete(cfg, "quantization_config")
	return writeJSON(filepath.Join(dst, "config.json"), cfg)
}
