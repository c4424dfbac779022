package ggufexport

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	parser "github.com/gpustack/gguf-parser-go"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/npy"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

func tinyDir(t *testing.T) string { return testenv.Testdata(t, "models/tiny") }

func heldout(t *testing.T, dir string) []int {
	a, err := npy.ReadFile(filepath.Join(dir, "heldout_ids.npy"))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := a.Ints()
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// ggufPerplexity evaluates an exported file through the decoders and qpack's forward pass.
func ggufPerplexity(t *testing.T, path, src string, seqs int) float64 {
	t.Helper()
	cfg, err := model.LoadConfig(src)
	if err != nil {
		t.Fatal(err)
	}
	w, err := OpenWeights(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	m, err := model.Load(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	r, err := model.Perplexity(m, heldout(t, src), 512, seqs)
	if err != nil {
		t.Fatal(err)
	}
	return r.Perplexity
}

func sourcePerplexity(t *testing.T, dir, idsDir string, seqs int) float64 {
	t.Helper()
	m, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := model.Perplexity(m, heldout(t, idsDir), 512, seqs)
	if err != nil {
		t.Fatal(err)
	}
	return r.Perplexity
}

// An F32 export is lossless: decoded, with q/k rows put back, the model computes the source's
// perplexity exactly; gguf-parser-go reads llama.cpp's metadata from it.
func TestExportTinyF32IsExact(t *testing.T) {
	src := tinyDir(t)
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	entries, err := Export(src, out, Options{Type: "f32", EmbedType: "f32"})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2+4*9+1 {
		t.Fatalf("%d tensors, want %d", len(entries), 2+4*9+1)
	}
	got, want := ggufPerplexity(t, out, src, 2), sourcePerplexity(t, src, src, 2)
	if got != want {
		t.Fatalf("perplexity of the F32 export %v, source %v", got, want)
	}
	pf, err := parser.ParseGGUFFile(out)
	if err != nil {
		t.Fatal(err)
	}
	a, tk := pf.Architecture(), pf.Tokenizer()
	if a.Architecture != "llama" || a.EmbeddingLength != 128 || a.BlockCount != 4 || a.AttentionHeadCount != 4 ||
		a.AttentionHeadCountKV != 2 || a.FeedForwardLength[0] != 384 || a.MaximumContextLength != 1024 {
		t.Fatalf("gguf-parser-go architecture: %+v", a)
	}
	if tk.Model != "gpt2" || tk.TokensLength != 2048 || tk.MergesLength == 0 || tk.BOSTokenID != 0 || tk.EOSTokenID != 0 {
		t.Fatalf("gguf-parser-go tokenizer: %+v", tk)
	}
	g, _ := gguf.Open(out)
	defer g.Close()
	if v, _ := g.Get("tokenizer.ggml.pre"); v != "gpt-2" {
		t.Fatalf("tokenizer.ggml.pre = %v", v)
	}
	if v, _ := g.Get("general.file_type"); v != uint32(0) {
		t.Fatalf("file_type = %v, want 0 (all F32)", v)
	}
}

// The q/k permutation against convert_hf_to_gguf.py's formula, written independently:
// reshape(n_head, 2, hd/2, K).swapaxes(1, 2): GGUF row h·hd + 2i + j is HF row h·hd + j·hd/2 + i.
func TestExportPermutesLlamaQK(t *testing.T) {
	src := tinyDir(t)
	out := filepath.Join(t.TempDir(), "tiny.gguf")
	if _, err := Export(src, out, Options{Type: "f32", EmbedType: "f16"}); err != nil {
		t.Fatal(err)
	}
	in, _ := safetensors.Open(src)
	defer in.Close()
	g, _ := gguf.Open(out)
	defer g.Close()
	for _, c := range []struct {
		hf, gg string
		heads  int
	}{{"model.layers.1.self_attn.q_proj.weight", "blk.1.attn_q.weight", 4}, {"model.layers.1.self_attn.k_proj.weight", "blk.1.attn_k.weight", 2},
		{"model.layers.1.self_attn.v_proj.weight", "blk.1.attn_v.weight", 0}} {
		hf, _ := in.Float32(c.hf)
		ti, _ := g.Tensor(c.gg)
		b, _ := g.Bytes(ti)
		k, hd := 128, 32
		for row := range len(hf) / k {
			srcRow := row
			if c.heads > 0 {
				h, rest := row/hd, row%hd
				i, j := rest/2, rest%2
				srcRow = h*hd + j*hd/2 + i
			}
			for x := range k {
				v := math.Float32frombits(binary.LittleEndian.Uint32(b[4*(row*k+x):]))
				if v != hf[srcRow*k+x] {
					t.Fatalf("%s row %d col %d: %v, want HF row %d's %v", c.gg, row, x, v, srcRow, hf[srcRow*k+x])
				}
			}
		}
	}
}

// A checkpoint whose schemes are ggml blocks (int8-g32-sym, int4-g32-sym), in qpack's or
// another layout, exports losslessly: the GGUF model's perplexity is the checkpoint's, exactly.
func TestExportLosslessRepack(t *testing.T) {
	src := tinyDir(t)
	for _, c := range []struct {
		s      quant.Scheme
		format string
	}{{quant.Scheme{Bits: 8, GroupSize: 32, Sym: true}, "qpack"}, {quant.Scheme{Bits: 4, GroupSize: 32, Sym: true}, "qpack"},
		{quant.Scheme{Bits: 4, GroupSize: 32, Sym: true}, "gptq"}, {quant.Scheme{Bits: 8, GroupSize: 32, Sym: true}, "compressed-tensors"}} {
		s := c.s
		dir := t.TempDir()
		opt := convert.DefaultOptions()
		opt.Alloc, opt.Format = convert.Uniform(s), c.format
		if _, err := convert.Convert(src, filepath.Join(dir, "q"), opt); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "q.gguf")
		entries, err := Export(filepath.Join(dir, "q"), out, Options{EmbedType: "f32"}) // tiny keeps F32 embeddings
		if err != nil {
			t.Fatal(err)
		}
		want := map[int]gguf.Type{8: gguf.Q8_0, 4: gguf.Q4_0}[s.Bits]
		var repacked int
		for _, e := range entries {
			if strings.HasPrefix(e.How, "repacked losslessly") {
				repacked++
				if e.Type != want {
					t.Fatalf("%s: %s, want %s", e.Name, e.Type, want)
				}
			}
		}
		if repacked != 4*7 {
			t.Fatalf("%s %s: %d tensors repacked, want 28", c.format, s, repacked)
		}
		got, ref := ggufPerplexity(t, out, filepath.Join(dir, "q"), 2), sourcePerplexity(t, filepath.Join(dir, "q"), src, 2)
		if got != ref {
			t.Fatalf("%s %s: perplexity of the GGUF %v, of the checkpoint %v", c.format, s, got, ref)
		}
		t.Logf("%s %s → %s: perplexity %.4f (the same as the checkpoint)", c.format, s, want, got)
	}
}

// A scheme with no ggml equivalent is refused by name; --requantize takes the lossy way.
func TestExportRefusesUnmappableScheme(t *testing.T) {
	src := tinyDir(t)
	dir := t.TempDir()
	opt := convert.DefaultOptions()
	opt.Alloc, opt.Format = convert.Uniform(quant.Scheme{Bits: 4, GroupSize: 128, Sym: true}), "qpack"
	if _, err := convert.Convert(src, filepath.Join(dir, "q"), opt); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "q.gguf")
	_, err := Export(filepath.Join(dir, "q"), out, Options{})
	if err == nil || !strings.Contains(err.Error(), "int4-g128-sym maps onto no ggml type") || !strings.Contains(err.Error(), "model.layers.0.") {
		t.Fatalf("want a refusal naming the module and scheme, got %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatal("a refused export left a file")
	}
	entries, err := Export(filepath.Join(dir, "q"), out, Options{Requantize: true, Type: "q8_0"})
	if err != nil {
		t.Fatal(err)
	}
	if e := entries[2]; e.Type != gguf.Q8_0 || !strings.Contains(e.How, "requantized (lossy, from int4-g128-sym)") {
		t.Fatalf("entry %+v", e)
	}
}

// copyModel copies a checkpoint directory so a test can edit it.
func copyModel(t *testing.T, src string) string {
	dst := t.TempDir()
	for _, f := range []string{"config.json", "tokenizer.json", "model.safetensors", "heldout_ids.npy"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dst, f), b, 0o644)
	}
	return dst
}

func editConfig(t *testing.T, dir string, edit func(map[string]any)) {
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	var c map[string]any
	json.Unmarshal(b, &c)
	edit(c)
	b, _ = json.Marshal(c)
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

func TestExportBadInput(t *testing.T) {
	src := tinyDir(t)
	cases := []struct {
		want  string
		setup func(dir string)
		opts  Options
	}{
		{"model_type \"qwen3\" has no GGUF export", func(d string) {
			editConfig(t, d, func(c map[string]any) { c["model_type"], c["architectures"] = "qwen3", []string{"Qwen3ForCausalLM"} })
		}, Options{}},
		{"no tokenizer.json", func(d string) { os.Remove(filepath.Join(d, "tokenizer.json")) }, Options{}},
		{"--type Q4_K: qpack quantizes float weights to", func(string) {}, Options{Type: "q4_k"}},
		{"unknown ggml type \"q9\"", func(string) {}, Options{Type: "q9"}},
		{"pre-tokenizer", func(d string) { editTokenizer(t, d) }, Options{}},
	}
	for _, c := range cases {
		dir := copyModel(t, src)
		c.setup(dir)
		out := filepath.Join(dir, "m.gguf")
		_, err := Export(dir, out, c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error containing %q, got %v", c.want, err)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%q: a failed export left a file", c.want)
		}
	}
}

// writeQ4K encodes rows into valid Q4_K blocks: per sub-block of 32 a 6-bit scale and min on
// a block-wide d and dmin (not ggml's search; any consistent choice decodes the same way in
// ggml), so the copy path can be tested without the k-quant quantizer.
func writeQ4K(x []float32) []byte {
	var out []byte
	for b := 0; b < len(x); b += 256 {
		blk := x[b : b+256]
		var scales, mins [8]float32
		var maxS, maxM float32
		for j := range 8 {
			lo, hi := float32(0), float32(0)
			for _, v := range blk[32*j : 32*j+32] {
				lo, hi = min(lo, v), max(hi, v)
			}
			scales[j], mins[j] = (hi-lo)/15, -lo
			maxS, maxM = max(maxS, scales[j]), max(maxM, mins[j])
		}
		d, dmin := quant.RoundF16(maxS/63), quant.RoundF16(maxM/63)
		var sc, mn [8]uint8
		for j := range 8 {
			if d > 0 {
				sc[j] = uint8(min(63, math.Round(float64(scales[j]/d))))
			}
			if dmin > 0 {
				mn[j] = uint8(min(63, math.Round(float64(mins[j]/dmin))))
			}
		}
		var packed [12]byte
		for j := range 4 {
			packed[j] = sc[j] | (sc[j+4]>>4)<<6
			packed[j+4] = mn[j] | (mn[j+4]>>4)<<6
			packed[j+8] = sc[j+4]&15 | (mn[j+4]&15)<<4
		}
		out = binary.LittleEndian.AppendUint16(out, f16bits(d))
		out = binary.LittleEndian.AppendUint16(out, f16bits(dmin))
		out = append(out, packed[:]...)
		q := make([]uint8, 256)
		for j := range 256 {
			s, m := d*float32(sc[j/32]), dmin*float32(mn[j/32])
			if s > 0 {
				q[j] = uint8(max(0, min(15, math.Round(float64((blk[j]+m)/s)))))
			}
		}
		for c := range 4 {
			for l := range 32 {
				out = append(out, q[64*c+l]|q[64*c+32+l]<<4)
			}
		}
	}
	return out
}

func f16bits(v float32) uint16 {
	b, _ := gguf.Encode(nil, gguf.F16, []float32{v})
	return binary.LittleEndian.Uint16(b)
}

// decodeQ4KOracle is dequantize_row_q4_K from ggml-common.h's block_q4_K, written apart
// from the package's decoder.
func decodeQ4KOracle(b []byte) []float64 {
	var out []float64
	for ; len(b) > 0; b = b[144:] {
		d, dmin := half(b[0:2]), half(b[2:4])
		s := b[4:16]
		for j := range 8 {
			var sc, m int
			if j < 4 {
				sc, m = int(s[j]&63), int(s[j+4]&63)
			} else {
				sc = int(s[j+4]&0x0f) | int(s[j-4]>>6)<<4
				m = int(s[j+4]>>4) | int(s[j]>>6)<<4
			}
			for l := range 32 {
				byt := b[16+32*(j/2)+l]
				q := int(byt & 15)
				if j%2 == 1 {
					q = int(byt >> 4)
				}
				out = append(out, d*float64(sc)*float64(q)-dmin*float64(m))
			}
		}
	}
	return out
}

func half(b []byte) float64 {
	return float64(quantF16(binary.LittleEndian.Uint16(b)))
}

func quantF16(h uint16) float32 {
	v, _ := gguf.Decode(nil, gguf.F16, []byte{byte(h), byte(h >> 8)})
	return v[0]
}

// syntheticLlama writes a random llama checkpoint with hidden size 256 (so rows hold whole
// 256-element k-quant blocks) and tiny's tokenizer, with every linear stored as Q4_K blocks
// in the qpack k-quant layout (P.qpack_shape, P.qpack_ggml, qpack.scheme.P = "q4_k").
func syntheticLlama(t *testing.T) (dir string, ggml map[string][]byte) {
	dir = t.TempDir()
	cfg := map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "hidden_size": 256,
		"intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
		"vocab_size": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
		"bos_token_id": 0, "eos_token_id": 0, "tie_word_embeddings": true}
	b, _ := json.Marshal(cfg)
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
	tok, _ := os.ReadFile(filepath.Join(tinyDir(t), "tokenizer.json"))
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), tok, 0o644)
	r := rand.New(rand.NewPCG(3, 4))
	var tensors []safetensors.WriterTensor
	meta := map[string]string{}
	ggml = map[string][]byte{}
	f32 := func(name string, shape []int, v []float32) {
		raw := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
		}
		tensors = append(tensors, safetensors.WriterTensor{Name: name, DType: safetensors.F32, Shape: shape, WriteTo: bytesTo(raw)})
	}
	randn := func(n int, s float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * s)
		}
		return v
	}
	ones := func(n int) []float32 {
		v := randn(n, 0.01)
		for i := range v {
			v[i]++
		}
		return v
	}
	f32("model.embed_tokens.weight", []int{2048, 256}, randn(2048*256, 0.5))
	f32("model.norm.weight", []int{256}, ones(256))
	f32("model.layers.0.input_layernorm.weight", []int{256}, ones(256))
	f32("model.layers.0.post_attention_layernorm.weight", []int{256}, ones(256))
	for _, l := range []struct {
		p    string
		n, k int
	}{{"self_attn.q_proj", 256, 256}, {"self_attn.k_proj", 128, 256}, {"self_attn.v_proj", 128, 256}, {"self_attn.o_proj", 256, 256},
		{"mlp.gate_proj", 512, 256}, {"mlp.up_proj", 512, 256}, {"mlp.down_proj", 256, 512}} {
		p := "model.layers.0." + l.p
		q := writeQ4K(randn(l.n*l.k, 0.06))
		ggml[p] = q
		shape := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(l.n)), uint64(l.k))
		tensors = append(tensors,
			safetensors.WriterTensor{Name: p + ".qpack_shape", DType: safetensors.I64, Shape: []int{2}, WriteTo: bytesTo(shape)},
			safetensors.WriterTensor{Name: p + ".qpack_ggml", DType: safetensors.U8, Shape: []int{l.n, l.k / 256 * 144}, WriteTo: bytesTo(q)})
		meta["qpack.scheme."+p] = "q4_k"
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), tensors, meta); err != nil {
		t.Fatal(err)
	}
	return dir, ggml
}

func bytesTo(b []byte) func(io.Writer) error {
	return func(w io.Writer) error { _, err := w.Write(b); return err }
}

// k-quant modules are copied byte for byte (q/k rows permuted as whole block rows), and the
// file decodes to the weights the independent Q4_K decoder reads from the source bytes.
func TestExportCopiesKQuantBytes(t *testing.T) {
	dir, ggml := syntheticLlama(t)
	out := filepath.Join(t.TempDir(), "k.gguf")
	entries, err := Export(dir, out, Options{})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := gguf.Open(out)
	defer g.Close()
	if v, _ := g.Get("general.file_type"); v != uint32(15) {
		t.Fatalf("file_type %v, want 15 (Q4_K_M)", v)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name, "blk.0.attn_") || strings.HasPrefix(e.Name, "blk.0.ffn_") {
			if strings.HasSuffix(e.Name, "norm.weight") {
				continue
			}
			if e.Type != gguf.Q4_K || e.How != "k-quant bytes copied (q4_k)" {
				t.Fatalf("%+v", e)
			}
		}
	}
	cfg, _ := model.LoadConfig(dir)
	w, err := OpenWeights(out, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for p, src := range ggml {
		name := p + ".weight"
		got, err := w.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		want := decodeQ4KOracle(src)
		for i := range want {
			if float64(got[i]) != float64(float32(want[i])) && math.Abs(float64(got[i])-want[i]) > 1e-6*math.Abs(want[i])+1e-9 {
				t.Fatalf("%s element %d: %v, independent decoder %v", name, i, got[i], want[i])
			}
		}
		ti, _ := g.Tensor(w.roles[name].gguf)
		b, _ := g.Bytes(ti)
		rowBytes := 144 * int(ti.Dims[0]) / 256
		rows := permuteRowsOracle(int(ti.Dims[1]), w.roles[name].heads)
		for r, s := range rows {
			if string(b[r*rowBytes:(r+1)*rowBytes]) != string(src[s*rowBytes:(s+1)*rowBytes]) {
				t.Fatalf("%s: GGUF row %d is not source row %d's bytes", name, r, s)
			}
		}
	}
	if _, ok := g.Tensor("output.weight"); ok {
		t.Fatal("tied embeddings: output.weight must be absent")
	}
}

func permuteRowsOracle(rows, heads int) []int {
	out := make([]int, rows)
	for r := range out {
		out[r] = r
		if heads > 0 {
			hd := rows / heads
			h, rest := r/hd, r%hd
			out[r] = h*hd + (rest%2)*hd/2 + rest/2
		}
	}
	return out
}

// Rows that are not whole blocks are refused, naming the tensor: a k-quant module whose K
// is not a multiple of 256, and a float tensor for a 32-block type.
func TestExportRefusesPartialBlocks(t *testing.T) {
	dir, _ := syntheticLlama(t)
	st, _ := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	var tensors []safetensors.WriterTensor
	for _, name := range st.Names() {
		info, _ := st.Info(name)
		b, _ := st.Bytes(name)
		b = append([]byte(nil), b...)
		if name == "model.layers.0.mlp.down_proj.qpack_shape" {
			binary.LittleEndian.PutUint64(b[8:], 300)
		}
		tensors = append(tensors, safetensors.WriterTensor{Name: name, DType: info.DType, Shape: info.Shape, WriteTo: bytesTo(b)})
	}
	meta := st.Metadata()
	st.Close()
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), tensors, meta); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "x.gguf")
	_, err := Export(dir, out, Options{})
	if err == nil || !strings.Contains(err.Error(), "module model.layers.0.mlp.down_proj: K = 300 is not a multiple of Q4_K's block size 256") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatal("a refused export left a file")
	}
	err = checkRows(role{hf: "model.layers.0.mlp.down_proj.weight"}, []int{10, 48}, gguf.Q8_0)
	if err == nil || !strings.Contains(err.Error(), "model.layers.0.mlp.down_proj.weight: rows of 48 values are not whole Q8_0 blocks of 32") {
		t.Fatalf("got %v", err)
	}
	if !reflect.DeepEqual(permuteRows(8, 2), []int{0, 2, 1, 3, 4, 6, 5, 7}) {
		t.Fatalf("permuteRows(8, 2) = %v", permuteRows(8, 2))
	}
}

// editTokenizer gives the tokenizer a pre-tokenizer llama.cpp has no name for.
func editTokenizer(t *testing.T, dir string) {
	b, _ := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	var c map[string]any
	json.Unmarshal(b, &c)
	c["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}
	b, _ = json.Marshal(c)
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644)
}

// qwen2: its own KV prefix, q/k rows not permuted (Qwen2 uses rotate-half in llama.cpp too),
// and the decoded model still computes the source's perplexity exactly.
func TestExportQwen2(t *testing.T) {
	dir := copyModel(t, tinyDir(t))
	editConfig(t, dir, func(c map[string]any) {
		c["model_type"], c["architectures"] = "qwen2", []string{"Qwen2ForCausalLM"}
	})
	out := filepath.Join(t.TempDir(), "q.gguf")
	if _, err := Export(dir, out, Options{Type: "f32", EmbedType: "f32"}); err != nil {
		t.Fatal(err)
	}
	g, _ := gguf.Open(out)
	defer g.Close()
	if v, _ := g.Get("general.architecture"); v != "qwen2" {
		t.Fatalf("architecture %v", v)
	}
	if v, _ := g.Get("qwen2.attention.head_count_kv"); v != uint32(2) {
		t.Fatalf("qwen2.attention.head_count_kv = %v", v)
	}
	in, _ := safetensors.Open(dir)
	defer in.Close()
	hf, _ := in.Float32("model.layers.0.self_attn.q_proj.weight")
	ti, _ := g.Tensor("blk.0.attn_q.weight")
	b, _ := g.Bytes(ti)
	for i, v := range hf {
		if math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) != v {
			t.Fatalf("qwen2 attn_q element %d differs from q_proj: rows must not be permuted", i)
		}
	}
	if got, want := ggufPerplexity(t, out, dir, 1), sourcePerplexity(t, dir, dir, 1); got != want {
		t.Fatalf("qwen2 export perplexity %v, source %v", got, want)
	}
}
