package safetensors

import (
	"fmt"
	"slices"
)

// Virtual is a tensor read by a function instead of from the files: a stored tensor transformed
// on read, such as a block FP8 weight dequantized with its scales (package quantized).
type Virtual struct {
	Info TensorInfo // Name, DType, Shape and Size of the bytes Read writes; File names the source
	// Read writes the tensor's Info.Size bytes into dst. It may be called concurrently.
	Read func(dst []byte) error
}

// Substitute makes v.Info.Name read as v, whether a stored tensor has that name or not, and
// leaves the names in hide out of Names (they stay readable by name). Call it before the
// checkpoint is read from concurrently.
func (c *Checkpoint) Substitute(v Virtual, hide ...string) error {
	if want := (v.Info.NumElements()*int64(v.Info.DType.Bits()) + 7) / 8; v.Info.Size != want || v.Read == nil {
		return fmt.Errorf("virtual tensor %q: %d bytes for %s%v (want %d) or no reader", v.Info.Name, v.Info.Size, v.Info.DType, v.Info.Shape, want)
	}
	if c.virtual == nil {
		c.virtual, c.hidden = map[string]Virtual{}, map[string]bool{}
	}
	c.virtual[v.Info.Name] = v
	for _, h := range hide {
		c.hidden[h] = true
	}
	delete(c.hidden, v.Info.Name)
	names := slices.DeleteFunc(slices.Clone(c.names), func(n string) bool { return c.hidden[n] || n == v.Info.Name })
	c.names = append(names, v.Info.Name)
	slices.Sort(c.names)
	return nil
}

// bytes reads a virtual tensor into a new buffer.
func (v Virtual) bytes() ([]byte, error) {
	b := make([]byte, v.Info.Size)
	if err := v.Read(b); err != nil {
		return nil, fmt.Errorf("tensor %q: %w", v.Info.Name, err)
	}
	return b, nil
}

// Stored describes the tensor stored under name and returns a zero-copy view of its bytes,
// whether or not a virtual tensor stands in for it.
func (c *Checkpoint) Stored(name string) (TensorInfo, []byte, bool) {
	r, ok := c.where[name]
	if !ok {
		return TensorInfo{}, nil, false
	}
	return r.info, r.file.bytes(r.info), true
}
