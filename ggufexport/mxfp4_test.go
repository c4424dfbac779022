package ggufexport_test

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
)

// specMXFP4Block decodes one GGUF MXFP4 block as ggml-common.h and ggml-quants.c describe it,
// written from that description: struct {uint8 e; uint8 qs[16]} for 32 elements; element j is
// the low nibble of qs[j] and element j+16 its high nibble; a nibble is an OCP E2M1 value (sign
// bit 3, two exponent bits of bias 1, one mantissa bit) and e an E8M0 exponent, 2^(e−127).
func specMXFP4Block(blk []byte) [32]float64 {
	e2m1 := func(n byte) float64 {
		exp, man := int(n>>1&3), float64(n&1)
		v := man / 2
		if exp > 0 {
			v = math.Ldexp(1+man/2, exp-1)
		}
		if n&8 != 0 {
			v = -v
		}
		return v
	}
	var out [32]float64
	scale := math.Ldexp(1, int(blk[0])-127)
	for j := range 16 {
		out[j] = e2m1(blk[1+j]&15) * scale
		out[j+16] = e2m1(blk[1+j]>>4) * scale
	}
	return out
}

// An mxfp4 qpack checkpoint (RTN, and GPTQ) exports losslessly to GGUF MXFP4: the file decodes,
// by ggml's dequantize_row_mxfp4 and by the spec decoder above, to the checkpoint's weights bit
// for bit, and the model scores the same perplexity from both.
func TestExportMXFP4IsLossless(t *testing.T) {
	src := syntheticLlama(t)
	for _, method := range []convert.Method{convert.RTN, convert.GPTQ} {
		dir := t.TempDir()
		opt := convert.DefaultOptions()
		opt.Alloc, opt.Format, opt.Method = convert.Uniform(quant.MXFP4Scheme), "qpack", method
		if method == convert.GPTQ {
			opt.Calib = convert.CalibOptions{File: filepath.Join(tinyDir(t), "heldout.txt"), Samples: 2, SeqLen: 64}
		}
		q := filepath.Join(dir, "q")
		if _, err := convert.Convert(src, q, opt); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "q.gguf")
		entries, err := ggufexport.Export(q, out, ggufexport.Options{EmbedType: "f32"})
		if err != nil {
			t.Fatal(err)
		}
		repacked := 0
		for _, e := range entries {
			if e.How == "repacked losslessly (mxfp4)" && e.Type == gguf.MXFP4 {
				repacked++
			}
		}
		if repacked != len(linears) {
			t.Fatalf("%s: %d linears repacked as MXFP4, want %d: %+v", method, repacked, len(linears), entries)
		}
		ck, err := quantized.Open(q)
		if err != nil {
			t.Fatal(err)
		}
		checkDecoded(t, out, src, gguf.MXFP4, func(name string) []float32 {
			v, err := ck.Float32(name)
			if err != nil {
				t.Fatal(err)
			}
			return v
		})
		g, err := gguf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		ti, _ := g.Tensor("blk.0.ffn_down.weight")
		data, err := g.Bytes(ti)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := ck.Float32("model.layers.0.mlp.down_proj.weight")
		for b := 0; b < len(data)/17; b++ {
			for j, v := range specMXFP4Block(data[17*b : 17*b+17]) {
				if float32(v) != want[32*b+j] {
					t.Fatalf("%s: ffn_down element %d decodes by the spec to %v, want %v", method, 32*b+j, v, want[32*b+j])
				}
			}
		}
		if ft, _ := g.Get("general.file_type"); ft != uint32(38) {
			t.Errorf("general.file_type %v, want 38 (LLAMA_FTYPE_MOSTLY_MXFP4_MOE)", ft)
		}
		g.Close()
		ck.Close()
		if method == convert.RTN {
			got, ref := ggufPerplexity(t, out, q, src, 1), sourcePerplexity(t, q, src, 1)
			if got != ref {
				t.Errorf("perplexity of the GGUF file %v, of the checkpoint %v", got, ref)
			}
		}
	}
}
