package convert

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
	"github.com/qpack-dev/qpack/safetensors"
	"lukechampine.com/blake3"
)

// roundTrip converts src with the scheme and format, dequantizes the result to F32, and checks
// that every quantized weight equals the in-memory dequantization of the same RTN exactly and
// that every other tensor is unchanged.
func roundTrip(t *testing.T, src, format string, s quant.Scheme) *Report {
	t.Helper()
	dir := t.TempDir()
	opt := DefaultOptions()
	opt.Alloc, opt.Format = Uniform(s), format
	r, err := Convert(src, filepath.Join(dir, "q"), opt)
	if err != nil {
		t.Fatalf("%s %s: %v", format, s, err)
	}
	if err := Dequantize(filepath.Join(dir, "q"), filepath.Join(dir, "dq"), safetensors.F32, false); err != nil {
		t.Fatalf("%s %s: dequantize: %v", format, s, err)
	}
	in, _ := safetensors.Open(src)
	defer in.Close()
	out, err := safetensors.Open(filepath.Join(dir, "dq"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if len(out.Names()) != len(in.Names()) {
		t.Fatalf("%s %s: %d tensors back, want %d", format, s, len(out.Names()), len(in.Names()))
	}
	quantizedCount := 0
	for _, name := range in.Names() {
		info, _ := in.Info(name)
		w, _ := in.Float32(name)
		got, err := out.Float32(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := w
		if tn := model.ParseTensorName(name); tn.Role.IsLinear() {
			qt, err := blockwise.Quantize(w, info.Shape[0], info.Shape[1], s, blockwise.Options{})
			if err != nil {
				t.Fatal(err)
			}
			want = qt.Dequantize(nil)
			quantizedCount++
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s %s: %s[%d] = %v, want %v", format, s, name, i, got[i], want[i])
			}
		}
	}
	if quantizedCount != r.Quantized || r.Quantized == 0 {
		t.Errorf("report says %d quantized, checked %d", r.Quantized, quantizedCount)
	}
	return r
}

func TestRoundTripEveryFormat(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	cases := []struct {
		format string
		scheme string
	}{
		{"gptq", "int4-g128-asym"}, {"gptq", "int4-g128-sym"}, {"gptq", "int3-g128-asym"},
		{"gptq", "int2-g64-asym"}, {"gptq", "int8-g128-sym"}, {"gptq", "int4-pc-asym"},
		{"gptq_v2", "int4-g128-asym"}, {"gptq_v2", "int3-g32-sym"},
		{"awq", "int4-g128-asym"}, {"awq", "int4-g64-asym"},
		{"compressed-tensors", "int4-g128-sym"}, {"compressed-tensors", "int4-g128-asym"},
		{"compressed-tensors", "int8-g128-sym"}, {"compressed-tensors", "int2-g64-asym"},
		{"qpack", "int4-g128-asym"}, {"qpack", "int3-g64-sym"}, {"qpack", "int2-g32-asym"},
		{"qpack", "int8-pc-sym"}, {"qpack", "nf4-g64"}, {"qpack", "fp8"},
		{"qpack", "bin-g128-sym"}, {"qpack", "bin-g64-asym"},
		{"qpack", "q2_k"}, {"qpack", "q3_k"}, {"qpack", "q4_k"}, {"qpack", "q5_k"}, {"qpack", "q6_k"},
	}
	for _, c := range cases {
		t.Run(c.format+"/"+c.scheme, func(t *testing.T) {
			s, err := quant.ParseScheme(c.scheme)
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, tiny, c.format, s)
		})
	}
}

// small-llama (BF16, 5 shards) in every layout: the BF16 fast path, exact round trips.
func TestSmallLlamaEveryFormat(t *testing.T) {
	src := testenv.Shared(t, "models/small-llama")
	for _, c := range []struct{ format, scheme string }{
		{"gptq", "int3-g128-asym"}, {"gptq", "int8-g128-sym"}, {"gptq", "int2-g64-asym"}, {"gptq_v2", "int4-g128-asym"},
		{"awq", "int4-g128-asym"}, {"compressed-tensors", "int4-g128-sym"}, {"qpack", "nf4-g64"}, {"qpack", "bin-g128-asym"}, {"qpack", "fp8"},
		{"qpack", "q4_k"}, {"qpack", "q6_k"},
	} {
		s, err := quant.ParseScheme(c.scheme)
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, src, c.format, s)
	}
}

// small-llama to 4-bit GPTQ: shards mirrored, ≈4.16 bits per weight plus g_idx.
func TestSmallLlamaGPTQ(t *testing.T) {
	src := testenv.Shared(t, "models/small-llama")
	r := roundTrip(t, src, "gptq", quant.Scheme{Bits: 4, GroupSize: 128})
	if len(r.Files) != 6 {
		t.Errorf("files %v, want 5 shards and the index", r.Files)
	}
	// 4 bits + F16 scale and 4-bit zero per 128 weights = 4.156; g_idx (I32 per input column)
	// adds 32/N, 0.03–0.25 bits for small-llama's 128–1024-row matrices.
	if r.QuantBPW < 4.156 || r.QuantBPW > 4.3 {
		t.Errorf("quantized bpw %.3f", r.QuantBPW)
	}
}

func TestRefusesUnsupportedSchemeBeforeWork(t *testing.T) {
	opt := DefaultOptions()
	opt.Alloc = Uniform(quant.Scheme{Bits: 1, GroupSize: 128, Grid: quant.Binary})
	dst := filepath.Join(t.TempDir(), "out")
	_, err := Convert(testenv.Testdata(t, "models/tiny"), dst, opt)
	if err == nil || !strings.Contains(err.Error(), "model.layers.0") || !strings.Contains(err.Error(), "qpack") {
		t.Fatalf("want an error naming a tensor and the qpack format, got %v", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("output created despite the refusal")
	}
}

// A NaN in one weight fails the conversion with the tensor's name and leaves no output.
func TestNonFiniteWeight(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	row := make([]byte, 4*128*128)
	binary.LittleEndian.PutUint32(row[4*(5*128+7):], math.Float32bits(float32(math.NaN())))
	ts := []safetensors.WriterTensor{
		safetensors.BytesTensor("model.layers.0.mlp.up_proj.weight", safetensors.F32, []int{128, 128}, row),
	}
	if err := safetensors.WriteFile(filepath.Join(src, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	opt := DefaultOptions()
	opt.Format = "qpack"
	dst := filepath.Join(dir, "out")
	_, err := Convert(src, dst, opt)
	if err == nil || !strings.Contains(err.Error(), "model.layers.0.mlp.up_proj.weight") {
		t.Fatalf("want an error naming the tensor, got %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("leftovers after a failed conversion: %v", entries)
	}
}

func TestExistingOutputNeedsOverwrite(t *testing.T) {
	dst := t.TempDir()
	if _, err := Convert(testenv.Testdata(t, "models/tiny"), dst, DefaultOptions()); err == nil || !strings.Contains(err.Error(), "--overwrite") {
		t.Fatalf("got %v", err)
	}
	opt := DefaultOptions()
	opt.Overwrite = true
	if _, err := Convert(testenv.Testdata(t, "models/tiny"), dst, opt); err != nil {
		t.Fatal(err)
	}
	c, err := quantized.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Format == nil || c.Format.Name() != "gptq" || len(c.Modules()) != 28 {
		t.Errorf("format %v, %d modules", c.Format, len(c.Modules()))
	}
	prov := c.Metadata()[ProvenanceKey]
	if !strings.Contains(prov, "model.layers.3.mlp.down_proj") {
		t.Errorf("provenance %q", prov)
	}
}

// The input digests, computed while converting, are in the committed header, for each choice.
func TestProvenanceInputHash(t *testing.T) {
	src := testenv.Testdata(t, "models/tiny")
	raw, err := os.ReadFile(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	sha := sha256.Sum256(raw)
	b3 := blake3.Sum256(raw)
	for _, c := range []struct{ algo, blake3, sha256 string }{
		{"", hex.EncodeToString(b3[:]), ""}, // the default
		{HashSHA256, "", hex.EncodeToString(sha[:])},
		{HashNone, "", ""},
	} {
		opt := DefaultOptions()
		opt.InputHash = c.algo
		dst := filepath.Join(t.TempDir(), "out")
		if _, err := Convert(src, dst, opt); err != nil {
			t.Fatal(err)
		}
		ck, err := safetensors.Open(dst)
		if err != nil {
			t.Fatal(err)
		}
		var p Provenance
		err = json.Unmarshal([]byte(ck.Metadata()[ProvenanceKey]), &p)
		ck.Close()
		want := InputFile{Name: "model.safetensors", Bytes: int64(len(raw)), BLAKE3: c.blake3, SHA256: c.sha256}
		if err != nil || len(p.Inputs) != 1 || p.Inputs[0] != want {
			t.Errorf("input hash %q: provenance inputs %+v (%v), want %+v", c.algo, p.Inputs, err, want)
		}
	}
	opt := DefaultOptions()
	opt.InputHash = "md5"
	if _, err := Convert(src, filepath.Join(t.TempDir(), "out"), opt); err == nil || !strings.Contains(err.Error(), "md5") {
		t.Errorf("input hash md5: got %v", err)
	}
}

// hashFile's BLAKE3 is the reference implementation's: the published digest of no bytes.
func TestBLAKE3EmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h := &inputHashes{algo: HashBLAKE3}
	got, err := h.hashFile(path)
	if want := "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"; err != nil || got != want {
		t.Errorf("BLAKE3 of an empty file: %s (%v), want %s", got, err, want)
	}
}

// BenchmarkConvertSmallLlama: the whole conversion to 4-bit GPTQ on the CPU, in input bytes/s.
func BenchmarkConvertSmallLlama(b *testing.B) {
	src := testenv.Shared(b, "models/small-llama")
	opt := DefaultOptions()
	opt.Device, opt.Overwrite = DeviceCPU, true
	dst := filepath.Join(b.TempDir(), "q")
	for i := 0; i < b.N; i++ {
		r, err := Convert(src, dst, opt)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(r.InBytes)
	}
}
