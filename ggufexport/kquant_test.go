package ggufexport_test

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/ggufexport"

	parser "github.com/gpustack/gguf-parser-go"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
	"github.com/qpack-dev/qpack/safetensors"
)

// syntheticLlama writes a random F32 llama checkpoint of one block whose linear rows are 512
// wide (two whole k-quant super-blocks), with tiny's tokenizer and held-out ids.
func syntheticLlama(t *testing.T) string {
	dir := t.TempDir()
	cfg := map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "hidden_size": 512,
		"intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
		"vocab_size": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
		"bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": true}
	b, _ := json.Marshal(cfg)
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
	for _, f := range []string{"tokenizer.json", "heldout_ids.npy"} {
		b, _ := os.ReadFile(filepath.Join(tinyDir(t), f))
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	r := rand.New(rand.NewPCG(3, 4))
	var tensors []safetensors.WriterTensor
	add := func(name string, shape []int, scale, offset float64) {
		numel := 1
		for _, d := range shape {
			numel *= d
		}
		raw := make([]byte, 4*numel)
		for i := 0; i < len(raw); i += 4 {
			v := offset + scale*r.NormFloat64()
			if r.IntN(100) == 0 {
				v *= 6 // outliers, as in real linears
			}
			binary.LittleEndian.PutUint32(raw[i:], math.Float32bits(float32(v)))
		}
		tensors = append(tensors, safetensors.WriterTensor{Name: name, DType: safetensors.F32, Shape: shape, WriteTo: bytesTo(raw)})
	}
	add("model.embed_tokens.weight", []int{2048, 512}, 0.05, 0)
	for _, norm := range []string{"model.norm", "model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm"} {
		add(norm+".weight", []int{512}, 0.01, 1)
	}
	for _, l := range []struct {
		p string
		n int
	}{{"self_attn.q_proj", 512}, {"self_attn.k_proj", 256}, {"self_attn.v_proj", 256}, {"self_attn.o_proj", 512},
		{"mlp.gate_proj", 512}, {"mlp.up_proj", 512}, {"mlp.down_proj", 512}} {
		add("model.layers.0."+l.p+".weight", []int{l.n, 512}, 0.04, 0)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), tensors, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

func bytesTo(b []byte) func(io.Writer) error {
	return func(w io.Writer) error { _, err := w.Write(b); return err }
}

var linears = []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}

// checkDecoded compares every linear of the GGUF file at out, decoded by ggml's decoders with
// q/k rows put back, with want(name) bit for bit, and has gguf-parser-go read the file.
func checkDecoded(t *testing.T, out, src string, typ gguf.Type, want func(name string) []float32) {
	t.Helper()
	_, w := openWeights(t, out, src)
	defer w.Close()
	for _, l := range linears {
		name := "model.layers.0." + l + ".weight"
		got, err := w.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		ref := want(name)
		for i := range ref {
			if math.Float32bits(got[i]) != math.Float32bits(ref[i]) {
				t.Fatalf("%s %s weight %d: the GGUF file decodes to %v, want %v", typ, name, i, got[i], ref[i])
			}
		}
	}
	pf, err := parser.ParseGGUFFile(out)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, ti := range pf.TensorInfos {
		if strings.HasPrefix(ti.Name, "blk.0.") && !strings.HasSuffix(ti.Name, "norm.weight") {
			n, _ := gguf.Bytes(typ, ti.Dimensions)
			if ti.Type.String() != typ.String() || int64(ti.Bytes()) != n {
				t.Errorf("gguf-parser-go reads %s as %s of %d bytes, want %s of %d", ti.Name, ti.Type, ti.Bytes(), typ, n)
			}
			seen++
		}
	}
	if seen != len(linears) {
		t.Errorf("gguf-parser-go found %d linears, want %d", seen, len(linears))
	}
}

// A k-quant qpack checkpoint exports losslessly: every linear becomes ggml blocks of its type
// holding qpack's exact values, so the GGUF file decodes to the checkpoint's dequantization
// bit for bit (and the model computes the same perplexity). GPTQ's k-quant checkpoints too:
// llama.cpp runs them as any Q3_K file.
func TestExportKQuantIsLossless(t *testing.T) {
	src := syntheticLlama(t)
	for _, c := range []struct {
		scheme  string
		imatrix bool
		method  convert.Method
	}{{"q2_k", false, "rtn"}, {"q3_k", false, "rtn"}, {"q4_k", false, "rtn"}, {"q5_k", false, "rtn"}, {"q6_k", false, "rtn"},
		{"q4_k", true, "rtn"}, {"q3_k", true, "gptq"}} {
		s, _ := quant.ParseScheme(c.scheme)
		typ, _ := ggmltype.TypeOf(s)
		q, out := exportLossless(t, src, c.scheme, c.imatrix, c.method, typ, map[int]uint32{2: 10, 3: 12, 4: 15, 5: 17, 6: 18}[s.Bits])
		if c.scheme == "q4_k" && !c.imatrix {
			got, ref := ggufPerplexity(t, out, src, src, 1), sourcePerplexity(t, q, src, 1)
			if got != ref {
				t.Errorf("q4_k: perplexity of the GGUF file %v, of the checkpoint %v", got, ref)
			}
			t.Logf("q4_k: perplexity %.4f of the GGUF file and of the checkpoint", got)
		}
	}
}

// Float weights export to k-quants with kquant's fitting (ggml's reference, as llama-quantize
// without an imatrix), and --requantize takes a quantized module there: the file holds what
// qpack's own RTN to that k-quant gives the same float weights.
func TestExportFloatToKQuant(t *testing.T) {
	src := syntheticLlama(t)
	in, _ := safetensors.Open(src)
	defer in.Close()
	rtn := func(s quant.Scheme, w []float32) []float32 {
		qt, err := blockwise.Quantize(w, len(w)/512, 512, s, blockwise.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return qt.Dequantize(nil)
	}
	q6, _ := quant.ParseScheme("q6_k")
	out := filepath.Join(t.TempDir(), "f.gguf")
	if _, err := ggufexport.Export(src, out, ggufexport.Options{Type: "q6_k"}); err != nil {
		t.Fatal(err)
	}
	checkDecoded(t, out, src, gguf.Q6_K, func(name string) []float32 {
		w, _ := in.Float32(name)
		return rtn(q6, w)
	})

	dir := t.TempDir()
	opt := convert.DefaultOptions()
	opt.Alloc, opt.Format = convert.Uniform(quant.Scheme{Bits: 4, GroupSize: 128}), "qpack"
	if _, err := convert.Convert(src, filepath.Join(dir, "q"), opt); err != nil {
		t.Fatal(err)
	}
	ck, _ := quantized.Open(filepath.Join(dir, "q"))
	defer ck.Close()
	out = filepath.Join(dir, "r.gguf")
	entries, err := ggufexport.Export(filepath.Join(dir, "q"), out, ggufexport.Options{Type: "q3_k", Requantize: true})
	if err != nil {
		t.Fatal(err)
	}
	if e := entries[2]; e.Type != gguf.Q3_K || !strings.Contains(e.How, "requantized (lossy, from int4-g128-asym)") {
		t.Fatalf("entry %+v", e)
	}
	q3, _ := quant.ParseScheme("q3_k")
	checkDecoded(t, out, src, gguf.Q3_K, func(name string) []float32 {
		w, _ := ck.Float32(name)
		return rtn(q3, w)
	})
}

// tiny's rows (128 and 384 wide) end in partial super-blocks: qpack holds them, GGUF cannot,
// so the export names the module and --requantize takes the lossy way.
func TestExportRefusesPartialSuperBlocks(t *testing.T) {
	dir := t.TempDir()
	q4, _ := quant.ParseScheme("q4_k")
	opt := convert.DefaultOptions()
	opt.Alloc, opt.Format = convert.Uniform(q4), "qpack"
	q := filepath.Join(dir, "q")
	if _, err := convert.Convert(tinyDir(t), q, opt); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "q.gguf")
	_, err := ggufexport.Export(q, out, ggufexport.Options{})
	if err == nil || !strings.Contains(err.Error(), "module model.layers.0.self_attn.q_proj: its q4_k rows of 128 weights end in a partial super-block") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatal("a refused export left a file")
	}
	entries, err := ggufexport.Export(q, out, ggufexport.Options{Requantize: true, Type: "q8_0", EmbedType: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	if e := entries[2]; e.Type != gguf.Q8_0 || !strings.Contains(e.How, "requantized (lossy, from q4_k)") {
		t.Fatalf("entry %+v", e)
	}
}

// An IQ qpack checkpoint exports losslessly too (its tensors are ggml's blocks): RTN with and
// without an importance matrix, GPTQ and awq+gptq, every file decoding to the checkpoint's
// weights bit for bit, with llama.cpp's file type.
func TestExportIQuantIsLossless(t *testing.T) {
	src := syntheticLlama(t)
	for _, c := range []struct {
		scheme  string
		imatrix bool
		method  convert.Method
	}{{"iq4_nl", false, "rtn"}, {"iq2_xxs", true, "rtn"}, {"iq3_xxs", false, "gptq"}, {"iq2_s", true, "awq+gptq"}} {
		s, _ := quant.ParseScheme(c.scheme)
		typ, _ := ggmltype.TypeOf(s)
		exportLossless(t, src, c.scheme, c.imatrix, c.method, typ, map[string]uint32{"iq4_nl": 25, "iq3_xxs": 23, "iq2_xxs": 19, "iq2_s": 28}[c.scheme])
	}
}

// exportLossless converts src to scheme with method (calibrating on tiny's text when imatrix
// or the method needs it), exports the checkpoint to GGUF with F32 embeddings (as stored, for
// perplexities) and checks that every linear was repacked as typ, that the file decodes to the
// checkpoint's weights bit for bit and that its general.file_type is fileType. It returns the
// checkpoint and the file.
func exportLossless(t *testing.T, src, scheme string, imatrix bool, method convert.Method, typ gguf.Type, fileType uint32) (q, out string) {
	t.Helper()
	s, _ := quant.ParseScheme(scheme)
	dir := t.TempDir()
	opt := convert.DefaultOptions()
	opt.Alloc, opt.Format, opt.Method = convert.Uniform(s), "qpack", method
	if imatrix || method != "rtn" {
		opt.Imatrix, opt.Calib = imatrix, convert.CalibOptions{File: filepath.Join(tinyDir(t), "heldout.txt"), Samples: 2, SeqLen: 64}
	}
	q = filepath.Join(dir, "q")
	if _, err := convert.Convert(src, q, opt); err != nil {
		t.Fatalf("%s: %v", scheme, err)
	}
	out = filepath.Join(dir, "q.gguf")
	entries, err := ggufexport.Export(q, out, ggufexport.Options{EmbedType: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	repacked := 0
	for _, e := range entries {
		if e.How == "repacked losslessly ("+scheme+")" && e.Type == typ {
			repacked++
		}
	}
	if repacked != len(linears) {
		t.Fatalf("%s: %d linears repacked as %s, want %d: %+v", scheme, repacked, typ, len(linears), entries)
	}
	ck, err := quantized.Open(q)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	checkDecoded(t, out, src, typ, func(name string) []float32 {
		v, err := ck.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	})
	g, _ := gguf.Open(out)
	ft, _ := g.Get("general.file_type")
	g.Close()
	if ft != fileType {
		t.Errorf("%s: general.file_type %v, want %d", scheme, ft, fileType)
	}
	return q, out
}

// Float weights export to the IQ types that need no importance matrix with iquant's fit (what
// llama-quantize does without an imatrix); the others are refused.
func TestExportFloatToIQuant(t *testing.T) {
	src := syntheticLlama(t)
	in, _ := safetensors.Open(src)
	defer in.Close()
	s, _ := quant.ParseScheme("iq3_s")
	out := filepath.Join(t.TempDir(), "f.gguf")
	if _, err := ggufexport.Export(src, out, ggufexport.Options{Type: "iq3_s"}); err != nil {
		t.Fatal(err)
	}
	checkDecoded(t, out, src, gguf.IQ3_S, func(name string) []float32 {
		w, _ := in.Float32(name)
		qt, err := blockwise.Quantize(w, len(w)/512, 512, s, blockwise.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return qt.Dequantize(nil)
	})
	if _, err := ggufexport.Export(src, out, ggufexport.Options{Type: "iq2_xs"}); err == nil || !strings.Contains(err.Error(), "need no importance matrix") {
		t.Errorf("--type iq2_xs: %v", err)
	}
}
