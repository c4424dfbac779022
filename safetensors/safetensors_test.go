package safetensors

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	nlp "github.com/nlpodyssey/safetensors"

	"github.com/qpack-dev/qpack/internal/testenv"
)

type checksum struct {
	DType  string  `json:"dtype"`
	Shape  []int   `json:"shape"`
	File   string  `json:"file"`
	SHA256 string  `json:"sha256"`
	Sum    float64 `json:"sum"`
	SumAbs float64 `json:"sumabs"`
}

func loadChecksums(t *testing.T) map[string]checksum {
	b, err := os.ReadFile("testdata/checksums.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]checksum
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// The checksums were computed once by testdata/checksums.py, a plain-Python parser that
// shares no code with this package.
func checkModel(t *testing.T, model, dir string, wantTensors int, wantParams int64) {
	sums := loadChecksums(t)
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(c.Names()) != wantTensors {
		t.Fatalf("%s: %d tensors, want %d", model, len(c.Names()), wantTensors)
	}
	var params int64
	for _, name := range c.Names() {
		info, _ := c.Info(name)
		params += info.NumElements()
		want, ok := sums[model+"/"+name]
		if !ok {
			t.Fatalf("%s: unexpected tensor %s", model, name)
		}
		if string(info.DType) != want.DType || filepath.Base(info.File) != want.File || !equalInts(info.Shape, want.Shape) {
			t.Errorf("%s: got %s %v in %s, want %s %v in %s", name, info.DType, info.Shape, info.File, want.DType, want.Shape, want.File)
		}
		raw, _ := c.Bytes(name)
		h := sha256.Sum256(raw)
		if hex.EncodeToString(h[:]) != want.SHA256 {
			t.Errorf("%s: sha256 mismatch", name)
		}
		v, err := c.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		var sum, sumAbs float64
		for _, x := range v {
			sum += float64(x)
			sumAbs += math.Abs(float64(x))
		}
		if math.Abs(sum-want.Sum) > 1e-9*want.SumAbs || math.Abs(sumAbs-want.SumAbs) > 1e-9*want.SumAbs {
			t.Errorf("%s: sum %v / %v, want %v / %v", name, sum, sumAbs, want.Sum, want.SumAbs)
		}
	}
	if params != wantParams {
		t.Errorf("%s: %d parameters, want %d", model, params, wantParams)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTinyModelValues(t *testing.T) {
	checkModel(t, "tiny", "../testdata/models/tiny", 39, 1_311_872)
}

func TestSmallLlamaValues(t *testing.T) {
	dir := testenv.Shared(t, "models/small-llama")
	checkModel(t, "small-llama", dir, 57, 12_587_904)
}

// randomTensors makes one tensor of every byte-sized dtype plus sub-byte and edge shapes.
func randomTensors(r *rand.Rand) ([]WriterTensor, map[string][]byte) {
	data := map[string][]byte{}
	var ts []WriterTensor
	add := func(name string, d DType, shape []int) {
		t := WriterTensor{Name: name, DType: d, Shape: shape}
		b := make([]byte, t.Size())
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		data[name] = b
		ts = append(ts, BytesTensor(name, d, shape, b))
	}
	for _, d := range []DType{BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64,
		F8E5M2, F8E4M3, F8E4M3FNUZ, F8E5M2FNUZ, F8E8M0, C64} {
		add("t."+string(d), d, []int{1 + r.IntN(5), 1 + r.IntN(7)})
	}
	add("f4", F4, []int{3, 6})
	add("f6", F6E2M3, []int{4, 4})
	add("scalar", F32, []int{})
	add("empty", F16, []int{0, 5})
	return ts, data
}

func TestWriteReadBack(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ts, data := randomTensors(r)
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := WriteFile(path, ts, map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Metadata(); got["format"] != "pt" || got["k"] != "v" {
		t.Errorf("metadata %v", got)
	}
	for _, wt := range ts {
		b, err := c.Bytes(wt.Name)
		if err != nil || !bytes.Equal(b, data[wt.Name]) {
			t.Errorf("%s: bytes differ (%v)", wt.Name, err)
		}
		info, _ := c.Info(wt.Name)
		if info.DType != wt.DType || !equalInts(info.Shape, wt.Shape) {
			t.Errorf("%s: got %s %v", wt.Name, info.DType, info.Shape)
		}
	}
	raw, _ := os.ReadFile(path)
	if n := binary.LittleEndian.Uint64(raw); n%8 != 0 {
		t.Errorf("header length %d not a multiple of 8", n)
	}
}

// nlpodyssey/safetensors is an independent parser; it knows the classic dtypes only.
func TestOracleParsesOurOutput(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	all, data := randomTensors(r)
	var ts []WriterTensor
	for _, wt := range all {
		if _, err := nlp.ParseDType(string(wt.DType)); err == nil && len(wt.Shape) > 0 && wt.Size() > 0 {
			ts = append(ts, wt)
		}
	}
	var buf bytes.Buffer
	if err := Write(&buf, ts, nil); err != nil {
		t.Fatal(err)
	}
	st, err := nlp.Deserialize(buf.Bytes())
	if err != nil {
		t.Fatalf("oracle rejects our file: %v", err)
	}
	if st.Len() != len(ts) {
		t.Fatalf("oracle sees %d tensors, want %d", st.Len(), len(ts))
	}
	for _, wt := range ts {
		v, ok := st.Tensor(wt.Name)
		if !ok || v.DType().String() != string(wt.DType) || !bytes.Equal(v.Data(), data[wt.Name]) {
			t.Errorf("oracle disagrees on %s", wt.Name)
		}
	}
}

func TestShardedCheckpoint(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ts, data := randomTensors(r)
	dir := t.TempDir()
	names, err := WriteCheckpoint(dir, ts, nil, 64)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 3 || names[len(names)-1] != IndexName {
		t.Fatalf("files %v", names)
	}
	ix, err := ReadIndex(filepath.Join(dir, IndexName))
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, wt := range ts {
		total += wt.Size()
	}
	if ix.Metadata["total_size"].(float64) != float64(total) || len(ix.WeightMap) != len(ts) {
		t.Errorf("index metadata %v, %d entries", ix.Metadata, len(ix.WeightMap))
	}
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, wt := range ts {
		b, _ := c.Bytes(wt.Name)
		if !bytes.Equal(b, data[wt.Name]) {
			t.Errorf("%s differs after sharding", wt.Name)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func TestWriterRejectsLies(t *testing.T) {
	short := WriterTensor{Name: "a", DType: F32, Shape: []int{4}, WriteTo: func(w io.Writer) error {
		_, err := w.Write(make([]byte, 12))
		return err
	}}
	path := filepath.Join(t.TempDir(), "bad.safetensors")
	err := WriteFile(path, []WriterTensor{short}, nil)
	if err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("want an error naming tensor a, got %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("a failed write left %s behind", path)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 0 {
		t.Errorf("temporary files left: %v", entries)
	}
	for _, ts := range [][]WriterTensor{
		{BytesTensor("x", "F17", []int{1}, nil)},
		{BytesTensor("x", F32, []int{1}, make([]byte, 4)), BytesTensor("x", F32, []int{1}, make([]byte, 4))},
		{BytesTensor("x", F4, []int{3}, make([]byte, 2))},
	} {
		if err := Write(io.Discard, ts, nil); err == nil {
			t.Errorf("expected an error for %v", ts[0].DType)
		}
	}
}

// fileWith builds a file from a header string and a data length.
func fileWith(header string, data int) []byte {
	b := make([]byte, 8, 8+len(header)+data)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, data)...)
}

func TestCorruptFiles(t *testing.T) {
	cases := map[string]struct {
		file []byte
		want string
	}{
		"short":        {[]byte{1, 2, 3}, "too short"},
		"huge header":  {binary.LittleEndian.AppendUint64(nil, 200_000_000), "exceeds the limit"},
		"past end":     {binary.LittleEndian.AppendUint64(nil, 100), "runs past the end"},
		"not object":   {fileWith(`[1,2]`, 0), "not a JSON object"},
		"bad json":     {fileWith(`{"a": {"dtype": `, 0), "invalid"},
		"dtype":        {fileWith(`{"a":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}}`, 4), "unknown dtype"},
		"size":         {fileWith(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4), "needs 8"},
		"hole":         {fileWith(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "hole"},
		"overlap":      {fileWith(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "overlap"},
		"truncated":    {fileWith(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, 8), "truncated"},
		"trailing":     {fileWith(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, 8), "trailing"},
		"duplicate":    {fileWith(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "duplicate"},
		"negative":     {fileWith(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4), "invalid"},
		"offsets":      {fileWith(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}`, 4), "invalid data_offsets"},
		"metadata":     {fileWith(`{"__metadata__":{"a":1}}`, 0), "strings to strings"},
		"misaligned":   {fileWith(`{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, 2), "whole bytes"},
		"no shape":     {fileWith(`{"a":{"dtype":"F32","data_offsets":[0,4]}}`, 4), "missing shape"},
		"shape overfl": {fileWith(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}`, 4), "overflows"},
	}
	dir := t.TempDir()
	for name, c := range cases {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".safetensors")
		os.WriteFile(p, c.file, 0o644)
		_, err := Open(p)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: got %v, want an error containing %q and the file name", name, err, c.want)
		}
	}
}

func TestCorruptIndex(t *testing.T) {
	write := func(dir, name string, b []byte) { os.WriteFile(filepath.Join(dir, name), b, 0o644) }
	shard := func(dir, file string, tensors ...string) {
		var ts []WriterTensor
		for _, n := range tensors {
			ts = append(ts, BytesTensor(n, F32, []int{1}, make([]byte, 4)))
		}
		if err := WriteFile(filepath.Join(dir, file), ts, nil); err != nil {
			t.Fatal(err)
		}
	}
	cases := map[string]struct {
		setup func(dir string)
		want  string
	}{
		"missing shard": {func(d string) {
			write(d, IndexName, []byte(`{"weight_map":{"a":"model-00001-of-00002.safetensors"}}`))
		}, "does not exist"},
		"missing tensor": {func(d string) {
			shard(d, "s1.safetensors", "a")
			write(d, IndexName, []byte(`{"weight_map":{"a":"s1.safetensors","b":"s1.safetensors"}}`))
		}, `"b" is not in any shard`},
		"wrong shard": {func(d string) {
			shard(d, "s1.safetensors", "a")
			shard(d, "s2.safetensors", "b")
			write(d, IndexName, []byte(`{"weight_map":{"a":"s2.safetensors","b":"s1.safetensors"}}`))
		}, "not in s2.safetensors"},
		"duplicate across shards": {func(d string) {
			shard(d, "s1.safetensors", "a")
			shard(d, "s2.safetensors", "a")
			write(d, IndexName, []byte(`{"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}}`))
		}, "appears in both"},
		"bad json":    {func(d string) { write(d, IndexName, []byte(`{"weight_map":`)) }, "invalid index JSON"},
		"path escape": {func(d string) { write(d, IndexName, []byte(`{"weight_map":{"a":"../x.safetensors"}}`)) }, "invalid shard name"},
		"empty dir":   {func(d string) {}, "no *.safetensors"},
	}
	for name, c := range cases {
		dir := t.TempDir()
		c.setup(dir)
		_, err := Open(dir)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", name, err, c.want)
		}
	}
}

func TestFloat32Conversions(t *testing.T) {
	ts := []WriterTensor{
		BytesTensor("bf16", BF16, []int{2}, []byte{0x80, 0x3f, 0x00, 0xc0}), // 1, -2
		BytesTensor("f16", F16, []int{2}, []byte{0x00, 0x3c, 0x00, 0xc0}),   // 1, -2
		BytesTensor("e4m3", F8E4M3, []int{2}, []byte{0x38, 0xb8}),           // 1, -1
		BytesTensor("e5m2", F8E5M2, []int{2}, []byte{0x3c, 0xc0}),           // 1, -2
		BytesTensor("f64", F64, []int{1}, binary.LittleEndian.AppendUint64(nil, math.Float64bits(0.5))),
		BytesTensor("f4", F4, []int{2}, []byte{0x92}), // low nibble 2 → 1, high 9 → -0.5
		BytesTensor("i32", I32, []int{1}, make([]byte, 4)),
	}
	path := filepath.Join(t.TempDir(), "c.safetensors")
	if err := WriteFile(path, ts, nil); err != nil {
		t.Fatal(err)
	}
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := map[string][]float32{"bf16": {1, -2}, "f16": {1, -2}, "e4m3": {1, -1}, "e5m2": {1, -2}, "f64": {0.5}, "f4": {1, -0.5}}
	for name, w := range want {
		got, err := c.Float32(name)
		if err != nil || len(got) != len(w) {
			t.Fatalf("%s: %v %v", name, got, err)
		}
		for i := range w {
			if got[i] != w[i] {
				t.Errorf("%s[%d] = %v, want %v", name, i, got[i], w[i])
			}
		}
	}
	if _, err := c.Float32("i32"); err == nil || !strings.Contains(err.Error(), "i32") {
		t.Errorf("integer to float32 should fail naming the tensor, got %v", err)
	}
	if _, err := c.Float32("nope"); err == nil {
		t.Errorf("missing tensor should fail")
	}
}

func BenchmarkReadSmallLlamaFloat32(b *testing.B) {
	c, err := Open(testenv.Shared(b, "models/small-llama"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var total int64
	bufs := map[string][]float32{}
	for _, n := range c.Names() {
		info, _ := c.Info(n)
		total += info.Size
		bufs[n] = make([]float32, info.NumElements())
	}
	b.SetBytes(total)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, n := range c.Names() {
			if _, err := c.Float32Into(n, bufs[n]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestReadIntoMatchesBytes reads every tensor of a sharded checkpoint both ways.
func TestReadIntoMatchesBytes(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(3, 4))
	var tensors []WriterTensor
	for i, shape := range [][]int{{3, 5}, {0}, {7}, {2, 2, 2}, {3*readPartMin/2 + 3}} { // the last is read in 3 parts
		data := make([]byte, 2*numelOf(shape))
		for j := range data {
			data[j] = byte(r.IntN(256))
		}
		tensors = append(tensors, BytesTensor(fmt.Sprintf("t%d", i), BF16, shape, data))
	}
	if _, err := WriteCheckpoint(dir, tensors, nil, 40); err != nil { // sharded
		t.Fatal(err)
	}
	ck, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, name := range ck.Names() {
		want, err := ck.Bytes(name)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if err := ck.ReadInto(name, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: ReadInto differs from Bytes", name)
		}
		if len(want) > 0 && ck.ReadInto(name, got[1:]) == nil {
			t.Errorf("%s: short destination accepted", name)
		}
	}
	if ck.ReadInto("missing", nil) == nil {
		t.Error("missing tensor accepted")
	}
}

func numelOf(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
