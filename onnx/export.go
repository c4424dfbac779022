// Package onnx exports a plain or quantized decoder checkpoint as a runnable ONNX graph with a
// KV cache, its quantized linears as MatMulNBits or DequantizeLinear→MatMul.
package onnx

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/qpack-dev/qpack/internal/staged"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/quantized"
)

// Options say how to export. The zero value writes MatMulNBits and refuses schemes the ops
// cannot hold.
type Options struct {
	Ops Ops // MatMulNBits (default) or QDQ
	// DequantizeUnsupported writes a module whose scheme the ops cannot hold (NF4, FP8, INT1)
	// as its dequantized float weight (float16 when every value is exactly one, else float32)
	// instead of refusing the export.
	DequantizeUnsupported bool
	Overwrite             bool
	Version               string    // recorded as the producer version
	Log                   io.Writer // one line per dequantized module; nil discards
}

// Report says what an export wrote.
type Report struct {
	Dir         string
	ModelBytes  int64          // model.onnx
	DataBytes   int64          // model.onnx.data
	Opset       int64          // ai.onnx opset
	IRVersion   int64          //
	Linears     map[string]int // linears per kind: "MatMulNBits", "DequantizeLinear", "float", "dequantized"
	Dequantized []string       // modules written dequantized
	Seconds     float64
}

// Files the export writes into its output directory.
const (
	ModelFile = "model.onnx"
	DataFile  = "model.onnx.data"
)

// copied are the side files a generation loop needs, copied when the source has them.
var copied = []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}

type exporter struct {
	src    string
	cfg    *model.Config
	ck     *quantized.Checkpoint
	opt    Options
	g      *Graph
	opset  int64
	usesMS bool
	report *Report
}

// Export writes the ONNX decoder of the checkpoint src into the directory dst: model.onnx,
// its weights in model.onnx.data, and the config and tokenizer files. Schemes the ops cannot
// hold are refused before anything is written (unless opt.DequantizeUnsupported); the output
// appears only when complete.
func Export(src, dst string, opt Options) (*Report, error) {
	start := time.Now()
	if opt.Ops == "" {
		opt.Ops = MatMulNBits
	}
	if opt.Ops != MatMulNBits && opt.Ops != QDQ {
		return nil, fmt.Errorf("unknown ONNX ops %q (want %s or %s)", opt.Ops, MatMulNBits, QDQ)
	}
	cfg, err := model.LoadConfig(src)
	if err != nil {
		return nil, err
	}
	if cfg.IsMoE() {
		return nil, fmt.Errorf("%s: %s is a mixture of experts (%d experts, %d per token); the ONNX export writes dense decoders only (its graph has no routing); export GGUF instead (qpack export gguf), whose llama.cpp architectures run the experts", src, cfg.ModelType, cfg.MoE.Experts, cfg.MoE.TopK)
	}
	ck, err := quantized.Open(src)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	if err := checkSchemes(ck, opt); err != nil {
		return nil, err
	}
	e := &exporter{src: src, cfg: cfg, ck: ck, opt: opt, opset: 21,
		report: &Report{Dir: dst, Linears: map[string]int{}}}
	if err := staged.Dir(dst, opt.Overwrite, nil, e.write); err != nil {
		return nil, err
	}
	e.report.Seconds = time.Since(start).Seconds()
	return e.report, nil
}

// checkSchemes refuses, before anything is written, the quantized modules whose scheme the
// ops cannot hold: one line per scheme, naming its tensors.
func checkSchemes(ck *quantized.Checkpoint, opt Options) error {
	if opt.DequantizeUnsupported {
		return nil
	}
	refused := map[quant.Scheme][]string{}
	var order []quant.Scheme
	for _, m := range ck.Modules() {
		info, err := ck.Module(m)
		if err != nil {
			return err
		}
		if opt.Ops.Supports(info.Scheme) != nil {
			if refused[info.Scheme] == nil {
				order = append(order, info.Scheme)
			}
			refused[info.Scheme] = append(refused[info.Scheme], m)
		}
	}
	var errs []error
	for _, s := range order {
		mods := refused[s]
		names := strings.Join(mods[:min(3, len(mods))], ", ")
		if len(mods) > 3 {
			names += fmt.Sprintf(" and %d more", len(mods)-3)
		}
		noun := "tensor"
		if len(mods) > 1 {
			noun = "tensors"
		}
		errs = append(errs, fmt.Errorf("%s %s: %w", noun, names, opt.Ops.Supports(s)))
	}
	return errors.Join(errs...)
}

func (e *exporter) write(dir string) error {
	g, err := newGraph(filepath.Join(dir, DataFile), DataFile)
	if err != nil {
		return err
	}
	e.g = g
	err = e.decoder()
	if err2 := g.closeData(); err == nil {
		err = err2
	}
	if err != nil {
		return err
	}
	e.report.Opset, e.report.IRVersion = e.opset, 10
	if e.opset >= 25 {
		e.report.IRVersion = 13
	}
	opsets := map[string]int64{"": e.opset}
	if e.usesMS {
		opsets["com.microsoft"] = 1
	}
	meta := map[string]string{"qpack.source": filepath.Base(filepath.Clean(e.src)), "qpack.ops": string(e.opt.Ops)}
	b := g.model(e.report.IRVersion, opsets, "qpack", e.opt.Version, meta)
	if err := os.WriteFile(filepath.Join(dir, ModelFile), b, 0o644); err != nil {
		return err
	}
	e.report.ModelBytes = int64(len(b))
	e.report.DataBytes = g.offset
	for _, name := range copied {
		data, err := os.ReadFile(filepath.Join(e.src, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// needOpset raises the ai.onnx opset the graph declares.
func (e *exporter) needOpset(v int64) { e.opset = max(e.opset, v) }

// linear writes y = x·Wᵀ + bias for the module prefix with W [n, k]: a quantized module through
// the chosen ops (or dequantized when asked), a plain one as a float MatMul.
func (e *exporter) linear(x, prefix string, n, k int) (string, error) {
	bias := ""
	if _, ok := e.ck.Shape(prefix + ".bias"); ok {
		b, err := e.floatTensor(prefix+".bias", n)
		if err != nil {
			return "", err
		}
		if bias, err = e.g.Float32s(prefix+".bias", b, int64(n)); err != nil {
			return "", err
		}
	}
	var w []float32
	kind := "float"
	if e.ck.IsModule(prefix) {
		t, err := e.ck.Unpack(prefix)
		if err != nil {
			return "", err
		}
		if t.N != n || t.K != k {
			return "", fmt.Errorf("%s: module %s is %d×%d, want %d×%d", e.src, prefix, t.N, t.K, n, k)
		}
		l, err := e.layout(prefix, t)
		switch {
		case err == nil && e.opt.Ops == MatMulNBits:
			e.report.Linears["MatMulNBits"]++
			return e.matMulNBits(x, prefix, l, bias)
		case err == nil:
			e.report.Linears["DequantizeLinear"]++
			return e.qdq(x, prefix, l, bias)
		case !e.opt.DequantizeUnsupported:
			return "", err
		}
		kind = "dequantized"
		w = t.Dequantize(nil)
		e.report.Dequantized = append(e.report.Dequantized, prefix)
		if e.opt.Log != nil {
			fmt.Fprintf(e.opt.Log, "%s: %s written dequantized\n", prefix, t.Scheme)
		}
	} else {
		var err error
		if w, err = e.floatTensor(prefix+".weight", n, k); err != nil {
			return "", err
		}
	}
	e.report.Linears[kind]++
	wt, err := e.floatWeight(prefix+".weight", w, n, k)
	if err != nil {
		return "", err
	}
	y := e.g.Op("MatMul", []string{x, wt})
	if bias != "" {
		y = e.g.Op("Add", []string{y, bias})
	}
	return y, nil
}

// layout checks that the ops hold t's scheme and lays out its blocks.
func (e *exporter) layout(prefix string, t *quant.Tensor) (*layout, error) {
	if err := e.opt.Ops.Supports(t.Scheme); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	return newLayout(prefix, t, e.opt.Ops)
}
