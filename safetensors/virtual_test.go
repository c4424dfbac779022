package safetensors

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A substituted tensor reads through its function by every accessor, hidden names leave Names
// but stay readable, and a virtual tensor whose size does not match its shape is refused.
func TestSubstitute(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	f16 := []byte{0, 0x3c, 0, 0x40} // 1, 2
	err := WriteFile(path, []WriterTensor{BytesTensor("a", F16, []int{2}, f16), BytesTensor("a_scale", F16, []int{1}, f16[:2])}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v := Virtual{Info: TensorInfo{Name: "a", DType: F32, Shape: []int{2}, Size: 8}, Read: func(dst []byte) error {
		binary.LittleEndian.PutUint32(dst, math.Float32bits(10))
		binary.LittleEndian.PutUint32(dst[4:], math.Float32bits(20))
		return nil
	}}
	if err := c.Substitute(v, "a_scale"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Names(), []string{"a"}) {
		t.Errorf("names %v", c.Names())
	}
	if info, ok := c.Info("a"); !ok || info.DType != F32 || info.Size != 8 {
		t.Errorf("info %+v", info)
	}
	if w, err := c.Float32("a"); err != nil || !slices.Equal(w, []float32{10, 20}) {
		t.Errorf("Float32 %v, %v", w, err)
	}
	dst := make([]byte, 8)
	if err := c.ReadInto("a", dst); err != nil || binary.LittleEndian.Uint32(dst[4:]) != math.Float32bits(20) {
		t.Errorf("ReadInto %v", err)
	}
	if b, err := c.Bytes("a"); err != nil || len(b) != 8 {
		t.Errorf("Bytes %v %v", b, err)
	}
	if w, err := c.Float32("a_scale"); err != nil || w[0] != 1 {
		t.Errorf("hidden tensor unreadable: %v %v", w, err)
	}
	bad := v
	bad.Info.Size = 6
	if err := c.Substitute(bad); err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("mis-sized virtual tensor: %v", err)
	}
}
