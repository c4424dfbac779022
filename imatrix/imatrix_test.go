package imatrix

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sample() *File {
	return &File{Chunks: 128, Dataset: "calib.txt", Entries: []Entry{
		{Name: "blk.0.attn_q.weight", Calls: 128, Mean: []float32{0.5, 1.25, 3, 0}},
		{Name: "blk.0.ffn_down.weight", Calls: 128, Mean: []float32{2, 4}},
	}}
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "imat.dat")
	want := sample()
	if err := Write(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Chunks != want.Chunks || got.Dataset != want.Dataset || len(got.Entries) != len(want.Entries) {
		t.Fatalf("read %+v, wrote %+v", got, want)
	}
	for i, e := range want.Entries {
		g := got.Entries[i]
		if g.Name != e.Name || g.Calls != e.Calls || len(g.Mean) != len(e.Mean) {
			t.Fatalf("entry %d: read %+v, wrote %+v", i, g, e)
		}
		for j := range e.Mean {
			if g.Mean[j] != e.Mean[j] { // powers of two times 128: exact
				t.Errorf("%s[%d] = %v, wrote %v", e.Name, j, g.Mean[j], e.Mean[j])
			}
		}
	}
	if m, ok := got.Lookup("blk.0.ffn_down.weight"); !ok || m[1] != 4 {
		t.Errorf("Lookup: %v %v", m, ok)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", st.Mode().Perm())
	}
}

// TestLlamaCppFile reads llama-imatrix's output for mid-llama (llama.cpp c392e509, 128
// chunks of 512 tokens of the shared calib.txt, from an F16 GGUF): 28 entries, one per
// decoder linear, 512 or 1536 channels each.
func TestLlamaCppFile(t *testing.T) {
	f, err := Read(filepath.Join("testdata", "mid-llama.imatrix"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Entries) != 28 || f.Chunks != 128 || !strings.HasSuffix(f.Dataset, "calib.txt") {
		t.Fatalf("%d entries, %d chunks, dataset %q", len(f.Entries), f.Chunks, f.Dataset)
	}
	for _, e := range f.Entries {
		want := 512
		if strings.Contains(e.Name, "ffn_down") {
			want = 1536
		}
		if e.Calls != 128 || len(e.Mean) != want {
			t.Errorf("%s: ncall %d, %d values", e.Name, e.Calls, len(e.Mean))
		}
		var sum float64
		for _, v := range e.Mean {
			sum += float64(v)
		}
		if sum <= 0 {
			t.Errorf("%s: mean x² sums to %g", e.Name, sum)
		}
	}
}

func TestBadFiles(t *testing.T) {
	var buf bytes.Buffer
	if err := sample().encode(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	if _, err := Decode(bytes.NewReader(good), int64(len(good))); err != nil {
		t.Fatal(err)
	}
	// Every truncation either fails or, cut exactly before the trailer, reads the entries.
	for n := range len(good) {
		f, err := Decode(bytes.NewReader(good[:n]), int64(n))
		if err == nil && (n != len(good)-8-len("calib.txt") || len(f.Entries) != 2) {
			t.Errorf("truncated to %d bytes: no error", n)
		}
	}
	corrupt := func(off int, b ...byte) []byte {
		c := bytes.Clone(good)
		copy(c[off:], b)
		return c
	}
	for name, data := range map[string][]byte{
		"no entries":       corrupt(0, 0, 0, 0, 0),
		"huge entry count": corrupt(0, 0xff, 0xff, 0xff, 0x7f),
		"negative name":    corrupt(4, 0xff, 0xff, 0xff, 0xff),
		"NaN value":        corrupt(4+4+19+4+4, 0x00, 0x00, 0xc0, 0x7f),
		"trailing bytes":   append(bytes.Clone(good), 1),
	} {
		if _, err := Decode(bytes.NewReader(data), int64(len(data))); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	dup := sample()
	dup.Entries[1].Name = dup.Entries[0].Name
	buf.Reset()
	dup.encode(&buf)
	if _, err := Decode(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate name: %v", err)
	}
	if err := Write(filepath.Join(t.TempDir(), "x.dat"), &File{}); err == nil {
		t.Error("empty file written")
	}
}

func FuzzDecode(f *testing.F) {
	var buf bytes.Buffer
	sample().encode(&buf)
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		Decode(bytes.NewReader(data), int64(len(data)))
	})
}
