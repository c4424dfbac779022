package safetensors

import (
	"testing"
)

// FuzzParseHeader: any header bytes either parse into tensors that tile the data exactly, or
// give an error; never a panic.
func FuzzParseHeader(f *testing.F) {
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`), int64(8))
	f.Add([]byte(`{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"F4","shape":[4],"data_offsets":[12,14]}}`), int64(14))
	f.Add([]byte(`{"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]},"e":{"dtype":"U8","shape":[0],"data_offsets":[8,8]}}`), int64(8))
	f.Add([]byte(`  {}`), int64(0))
	f.Add([]byte(`{"a":{"dtype":"F8_E4M3","shape":[9223372036854775807],"data_offsets":[0,1]}}`), int64(1))
	f.Fuzz(func(t *testing.T, header []byte, dataSize int64) {
		if dataSize < 0 || dataSize > 1<<40 {
			return
		}
		h, err := ParseHeader("fuzz", header, dataSize)
		if err != nil {
			return
		}
		var total int64
		for _, ti := range h.Tensors {
			if ti.Size != byteSize(ti.DType, ti.NumElements()) || ti.Offset < h.DataBase {
				t.Fatalf("inconsistent tensor %+v", ti)
			}
			total += ti.Size
		}
		if total != dataSize {
			t.Fatalf("tensors cover %d of %d bytes", total, dataSize)
		}
	})
}

// FuzzParseIndex: index files either parse with safe shard names or give an error.
func FuzzParseIndex(f *testing.F) {
	f.Add([]byte(`{"metadata":{"total_size":8},"weight_map":{"a":"model-00001-of-00002.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"a":"../../etc/passwd"}}`))
	f.Add([]byte(`{"weight_map":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ix, err := ParseIndex("fuzz", b)
		if err != nil {
			return
		}
		for _, s := range ix.Shards() {
			if s == "" || s == "." || s == ".." {
				t.Fatalf("unsafe shard name %q accepted", s)
			}
			for _, c := range s {
				if c == '/' {
					t.Fatalf("shard name with a path %q accepted", s)
				}
			}
		}
	})
}
