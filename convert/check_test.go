package convert

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/internal/testenv"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// What the method, the format and the allocator settings cannot do together is refused before
// any work: the calibration file named here does not exist, so an error about it would mean
// the conversion had started calibrating.
func TestRefusedBeforeAnyWork(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	missing := filepath.Join(t.TempDir(), "no-such-calib.txt")
	ladder, err := alloc.ParseLadder("int3-g128-asym,nf4-g64,int4-g128-asym")
	if err != nil {
		t.Fatal(err)
	}
	budget := alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: 3.5}
	cases := []struct {
		name string
		edit func(o *Options)
		want string
	}{
		{"budget in the gptq format", func(o *Options) { o.Method, o.Alloc = GPTQ, budget }, "use --format qpack"},
		{"an NF4 rung under awq", func(o *Options) {
			o.Method, o.Format, o.Alloc = AWQ, "qpack", alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: 3.5, Ladder: ladder}
		}, "the ladder's rung nf4-g64: awq quantizes to integer grids"},
		{"k-quants under act-order without static groups", func(o *Options) {
			o.Method, o.Format, o.Alloc, o.GPTQ.ActOrder = GPTQ, "qpack", Uniform(quant.Scheme{Bits: 4, Grid: quant.KQuant, GroupSize: 32}), true
		}, "--static-groups"},
		{"lm_head under gptq", func(o *Options) { o.Method, o.Alloc.QuantizeHead = GPTQ, true }, "decoder linears only"},
		{"nvfp4 under awq", func(o *Options) { o.Method, o.Format, o.Alloc = AWQ, "qpack", Uniform(quant.NVFP4Scheme) }, "awq quantizes to integer grids"},
		{"mxfp4 under act-order without static groups", func(o *Options) {
			o.Method, o.Format, o.Alloc, o.GPTQ.ActOrder = GPTQ, "qpack", Uniform(quant.MXFP4Scheme), true
		}, "--static-groups"},
		{"nvfp4 under gptq with --clip", func(o *Options) {
			o.Method, o.Format, o.Alloc, o.Clip = GPTQ, "qpack", Uniform(quant.NVFP4Scheme), true
		}, "no clipping search"},
		{"block FP8 with --imatrix", func(o *Options) { o.Format, o.Alloc, o.Imatrix = "fp8", Uniform(quant.FP8BlockScheme(128)), true }, "no clipping or imatrix search"},
		{"an override mixing schemes in the gptq format", func(o *Options) {
			ov, err := alloc.ParseOverrides([]string{"down_proj=int8-g128-sym"})
			if err != nil {
				t.Fatal(err)
			}
			o.Method, o.Alloc.Overrides = GPTQ, ov
		}, "single quantization config"},
	}
	for _, c := range cases {
		opt := DefaultOptions()
		opt.Calib = CalibOptions{File: missing}
		c.edit(&opt)
		_, err := Convert(tiny, filepath.Join(t.TempDir(), "out"), opt)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "no-such-calib") {
			t.Errorf("%s: got %v, want %q before the calibration data is read", c.name, err, c.want)
		}
		if _, err := Plan(tiny, opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Plan: got %v, want %q", c.name, err, c.want)
		}
	}
}

// A plan that keeps every tensor is refused, saying why, and writes nothing; a budget above the
// ladder's top says so.
func TestNothingToQuantize(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	keepAll, err := alloc.ParseOverrides([]string{".*=keep"})
	if err != nil {
		t.Fatal(err)
	}
	ladder, err := alloc.ParseLadder("int4-g128-asym,keep")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		alloc alloc.Options
		want  string
	}{
		"override keep":               {alloc.Options{Strategy: alloc.StrategyUniform, Ladder: Uniform(DefaultScheme).Ladder, Overrides: keepAll}, "nothing to quantize: every tensor is kept"},
		"target-bpw 40 (F32 weights)": {alloc.Options{Strategy: alloc.StrategyBudget, TargetBPW: 40, Ladder: ladder}, "at or above the ladder's top"},
	} {
		opt := DefaultOptions()
		opt.Alloc, opt.Format = c.alloc, "qpack"
		dst := filepath.Join(t.TempDir(), "out")
		if _, err := Convert(tiny, dst, opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
		if entries, _ := os.ReadDir(filepath.Dir(dst)); len(entries) != 0 {
			t.Errorf("%s: a refused conversion left %v", name, entries)
		}
	}
}

// The output holds the files runtimes need beside the weights, not the evaluation data that
// happened to sit in the source directory.
func TestCopiesRuntimeFilesOnly(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "out")
	if _, err := Convert(testenv.Testdata(t, "models/tiny"), dst, DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"tokenizer.json": true, "generation_config.json": true, "config.json": true,
		"heldout.txt": false, "heldout_ids.npy": false, "probe_logits.npy": false, "reference.json": false} {
		if _, err := os.Stat(filepath.Join(dst, name)); (err == nil) != want {
			t.Errorf("%s: copied %v, want %v", name, err == nil, want)
		}
	}
	for name, want := range map[string]bool{"LICENSE": true, "LICENSE.txt": true, "chat_template.jinja": true, "modeling_x.py": true,
		"tokenizer.model": true, "calib.txt": false, "eval.npy": false, "notes.json": false} {
		if runtimeFile(name) != want {
			t.Errorf("runtimeFile(%q) = %v", name, !want)
		}
	}
}

// A NaN in a kept tensor (a norm weight here) is refused naming the tensor and the element, as a
// NaN in a quantized linear is.
func TestNonFiniteKeptTensorRefused(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	src := t.TempDir()
	for _, name := range []string{"config.json", "tokenizer.json"} {
		b, err := os.ReadFile(filepath.Join(tiny, name))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(src, name), b, 0o644)
	}
	b, err := os.ReadFile(filepath.Join(tiny, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.Open(tiny)
	if err != nil {
		t.Fatal(err)
	}
	info, ok := ck.Info("model.layers.2.post_attention_layernorm.weight")
	ck.Close()
	if !ok || info.DType != safetensors.F32 {
		t.Fatalf("tiny's norm weight: %v %v", ok, info)
	}
	binary.LittleEndian.PutUint32(b[info.Offset+4*5:], math.Float32bits(float32(math.NaN())))
	os.WriteFile(filepath.Join(src, "model.safetensors"), b, 0o644)
	dst := filepath.Join(t.TempDir(), "out")
	_, err = Convert(src, dst, DefaultOptions())
	if err == nil || !strings.Contains(err.Error(), "model.layers.2.post_attention_layernorm.weight") || !strings.Contains(err.Error(), "[5] is not finite") {
		t.Fatalf("got %v, want the NaN named", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("the refused conversion left %s", dst)
	}
}
