package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/convert"
	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/progress"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// planFlags are shared by convert and plan: they say what to quantize, and how.
func planFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "method", Value: "rtn", Usage: "quantization method: rtn (round-to-nearest, no data), gptq, awq (activation-aware scales) or awq+gptq (AWQ scales, then GPTQ); all but rtn need --calib"},
		&cli.IntFlag{Name: "awq-search-tokens", Value: convert.DefaultAWQSearchTokens, Usage: "awq: calibration tokens (evenly spaced) the α search measures its loss on; mean|x| uses all"},
		&cli.BoolFlag{Name: "awq-no-clip", Usage: "awq: skip the clipping search"},
		&cli.StringFlag{Name: "calib-math", Value: convert.CalibF16, Usage: "GPU: how the calibration's GEMMs (GPTQ's and AWQ's passes, AWQ's scale search, the plan's statistics and output probe) round their operands: fp16 (scaled by powers of two: TF32's precision at twice its rate), tf32, bf16 (twice TF32's rate, 8-bit significand), bf16-gram (the Gram matrices only) or fp32"},
		&cli.BoolFlag{Name: "awq-duo", Usage: "awq: AutoAWQ's duo-scaling candidates, mean|x|^α / (mean|w|/absmax)^(1−α)"},
		&cli.BoolFlag{Name: "act-order", Usage: "gptq: quantize columns by decreasing activation energy (desc_act, writes a non-trivial g_idx)"},
		&cli.BoolFlag{Name: "static-groups", Usage: "gptq: fit group parameters before any update (trivial g_idx even with --act-order)"},
		&cli.Float64Flag{Name: "damp", Value: 0.01, Usage: "gptq: damping as a fraction of the mean Hessian diagonal (raised ×10 when the Hessian will not factor)"},
		&cli.BoolFlag{Name: "no-true-sequential", Usage: "gptq: quantize a block's linears all at once instead of q/k/v, o, gate/up, down in turn"},
		&cli.StringFlag{Name: "moe-calib", Value: "routed", Usage: "mixtures of experts: calibrate each expert on the tokens routed to it (routed), on them weighted by the square of their routing weight (weighted), or on every token (all)"},
		&cli.IntFlag{Name: "moe-min-tokens", Value: convert.DefaultMinExpertTokens, Usage: "mixtures of experts: an expert that fewer calibration tokens were routed to (in its block) is calibrated on every token instead; the log says which"},
		&cli.IntFlag{Name: "bits", Value: 4, Usage: "code width of the integer grid: 2 to 8 (5–7 in format qpack only)"},
		&cli.IntFlag{Name: "group-size", Value: 128, Usage: "input channels per scale; -1 or 0 for one group per output channel"},
		&cli.BoolFlag{Name: "sym", Usage: "symmetric grid (the default)"},
		&cli.BoolFlag{Name: "asym", Usage: "asymmetric grid with a zero point per group"},
		&cli.StringFlag{Name: "scheme", Usage: "full scheme name instead of --bits/--group-size/--sym, e.g. int4-g128-asym, nf4-g64, fp8, bin-g128-sym, q4_k, iq3_s, nvfp4, mxfp4, fp8-b128"},
		&cli.StringFlag{Name: "format", Value: "gptq", Usage: "output layout: " + strings.Join(packing.Names(), ", ") + ", or gguf (one file for llama.cpp and ollama: -o FILE.gguf; docs/gguf.md)"},
		&cli.StringFlag{Name: "preset", Usage: "--format gguf: a llama.cpp file type (Q4_K_M, Q3_K_M, Q5_K_M, Q2_K, Q3_K_S, Q4_K_S, Q5_K_S, Q6_K, Q8_0, …): every tensor gets the type llama-quantize gives it; the default under --format gguf when no scheme, strategy or budget is given is Q4_K_M"},
		&cli.StringFlag{Name: "embed-type", Aliases: []string{"token-embedding-type"}, Usage: "--format gguf: ggml type of token_embd (f16, q8_0, q6_k, …; default: llama.cpp's for the file type)"},
		&cli.StringFlag{Name: "output-type", Aliases: []string{"output-tensor-type"}, Usage: "--format gguf: ggml type of output, the classifier (default: llama.cpp's for the file type, Q6_K for the k-quants)"},
		&cli.StringFlag{Name: "tokenizer-pre", Usage: "--format gguf: tokenizer.ggml.pre to write instead of the detected one (gpt-2, llama-bpe, qwen2, …)"},
		&cli.BoolFlag{Name: "clip", Usage: "search an MSE-optimal clipping range per group"},
		&cli.BoolFlag{Name: "imatrix", Usage: "importance-weighted scale search per group: least Σ E[x²]·(w−ŵ)² (RTN: E[x²] from --calib; GPTQ: diag H); on by default under --method awq+gptq (--imatrix=false turns it off)"},
		&cli.StringFlag{Name: "imatrix-file", Usage: "llama.cpp's importance matrix (llama-imatrix's output, or `qpack imatrix`'s) as the importance E[x²] instead of measuring one; implies --imatrix"},
		&cli.StringFlag{Name: "strategy", Value: "uniform", Usage: "precision per tensor: uniform (the scheme everywhere), evolved (protect edges, measure the middle) or budget (least error under --target-bpw/--target-size)"},
		&cli.StringFlag{Name: "ladder", Usage: "candidate schemes, lowest precision first, comma-separated (keep = input dtype); default: evolved uses the scheme and its 8-bit version, budget int2..int8 g128 sym and keep"},
		&cli.StringSliceFlag{Name: "override", Usage: "'REGEX=SCHEME' pins matching tensors (first match wins; SCHEME may be keep); repeatable"},
		&cli.BoolFlag{Name: "output-probe", Value: true, Usage: "budget with --calib: weigh each linear's error by its measured cost to the output (the KL when it alone is quantized); --output-probe=false counts every tensor's relative error alike"},
		&cli.Float64Flag{Name: "target-bpw", Usage: "budget: at most this many bits per weight over the quantized tensors (scales and zeros counted)"},
		&cli.StringFlag{Name: "target-size", Usage: "budget: at most this many bytes for the whole output (e.g. 4GB)"},
		&cli.BoolFlag{Name: "quantize-embeddings", Usage: "quantize the token embedding too"},
		&cli.BoolFlag{Name: "quantize-head", Usage: "quantize lm_head too"},
		&cli.StringFlag{Name: "plan", Usage: "replay a plan written by `qpack plan --json` instead of planning"},
		configFlag,
		&cli.StringFlag{Name: "calib", Usage: "calibration data (text, or .npy token ids): sensitivity becomes the activation-weighted error"},
		&cli.IntFlag{Name: "calib-samples", Value: 128, Usage: "calibration sequences"},
		&cli.IntFlag{Name: "calib-seqlen", Value: 512, Usage: "tokens per calibration sequence"},
		&cli.StringFlag{Name: "device", Value: "auto", Usage: "where the calibration passes and quantization run: auto (the GPU when there is one), cpu, or cuda (fail without a GPU, or for a tensor the GPU cannot do)"},
		&cli.StringFlag{Name: "devices", Value: "all", Usage: "GPUs to use, e.g. 0,1 (ordinals as the driver counts them, after CUDA_VISIBLE_DEVICES): GPTQ, AWQ and awq+gptq calibrate on all of them, and the plan's statistics and output probe run on all; RTN runs on the first"},
	}
}

func convertCommand() *cli.Command {
	return &cli.Command{
		Name:      "convert",
		Usage:     "quantize a checkpoint and write it in a packed layout",
		ArgsUsage: "SRC",
		Flags: append(planFlags(),
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output directory (required)", Required: true},
			&cli.StringFlag{Name: "max-shard-size", Usage: "split output into shards of at most this size (e.g. 5GB, 500MB); default: shard like the input"},
			&cli.BoolFlag{Name: "overwrite", Usage: "replace the output directory if it exists"},
			&cli.StringFlag{Name: "report", Usage: "write a JSON report of the conversion to this file"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no per-tensor progress lines"},
			&cli.BoolFlag{Name: "measure-error", Usage: "compute each weight's relative error ‖W−Ŵ‖/‖W‖ for the log and the report (costs a CPU dequantization per tensor)"},
			&cli.IntFlag{Name: "gpu-slots", Value: convert.DefaultGPUSlots, Usage: "tensors on the GPU at once (each holds pinned and GPU memory the size of the largest tensor)"},
			&cli.StringFlag{Name: "input-hash", Value: convert.HashBLAKE3, Usage: "digest of each input file recorded in the provenance: blake3 (uses every core; b3sum prints it), sha256 (sha256sum and the Hub's LFS oid; one core per file) or none"},
			&cli.BoolFlag{Name: "sync", Usage: "flush the output to disk before renaming it into place, so that it survives a power loss right after (runs at about the disk's write speed); without it a killed or failed run still leaves nothing that looks complete"},
		),
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("convert needs exactly one SRC argument")
			}
			opt, err := convertCommandOptions(c)
			if err != nil {
				return err
			}
			if err := useOnlyGPUs(opt.Device, convert.GPUsUsed(opt)); err != nil {
				return err
			}
			if !c.Bool("quiet") {
				bar := progress.New(c.App.ErrWriter, "convert", "tensors")
				opt.Log, opt.Progress = bar.Log(c.App.ErrWriter), bar.Update
				defer bar.Finish()
			}
			ctx, stop := interruptContext()
			defer stop()
			opt.Context = ctx
			r, err := convert.Convert(c.Args().First(), c.String("output"), opt)
			if err != nil {
				return interruptedExit(ctx, "convert", err, "nothing was written (the staging directory was removed)")
			}
			fmt.Fprintf(c.App.Writer, "wrote %s: %d tensors quantized (%s) at %.3f bits/weight; %s → %s bytes (%.2f×) in %.1fs (hash %.1fs, quantize %.1fs, write %.1fs, commit %.1fs)\n",
				r.Output, r.Quantized, r.Method, r.QuantBPW, thousands(r.InBytes), thousands(r.OutBytes), r.Compression, r.Seconds,
				r.HashSeconds, r.QuantizeSeconds, r.WriteSeconds, r.CommitSeconds)
			if p := c.String("report"); p != "" {
				return writeJSONFile(p, r)
			}
			return nil
		},
	}
}

// convertCommandOptions reads convert's flags (a batch job's keys are the same).
func convertCommandOptions(c *cli.Context) (convert.Options, error) {
	opt, err := convertOptions(c)
	if err != nil {
		return opt, err
	}
	if v := c.String("max-shard-size"); v != "" {
		if opt.MaxShardSize, err = parseSize(v); err != nil {
			return opt, fmt.Errorf("--max-shard-size: %w", err)
		}
	}
	opt.Overwrite = c.Bool("overwrite")
	opt.MeasureError = c.Bool("measure-error")
	opt.InputHash = c.String("input-hash")
	opt.GPUSlots = c.Int("gpu-slots")
	opt.Sync = c.Bool("sync")
	return opt, nil
}

// convertOptions reads the planning flags.
func convertOptions(c *cli.Context) (convert.Options, error) {
	if err := applyConfig(c); err != nil {
		return convert.Options{}, err
	}
	method, err := convert.ParseMethod(c.String("method"))
	if err != nil {
		return convert.Options{}, err
	}
	opt := method.DefaultOptions()
	opt.Version = version
	opt.Device = c.String("device")
	if opt.Devices, err = parseDevices(c.String("devices")); err != nil {
		return opt, err
	}
	opt.CalibMath = c.String("calib-math")
	opt.Format = c.String("format")
	opt.Clip = c.Bool("clip")
	if c.IsSet("imatrix") {
		opt.Imatrix = c.Bool("imatrix")
	}
	opt.ImatrixFile = c.String("imatrix-file")
	opt.GPTQ = convert.GPTQOptions{Damp: c.Float64("damp"), ActOrder: c.Bool("act-order"), StaticGroups: c.Bool("static-groups"),
		TrueSequential: !c.Bool("no-true-sequential")}
	opt.AWQ = convert.AWQOptions{SearchTokens: c.Int("awq-search-tokens"), NoClip: c.Bool("awq-no-clip"), Duo: c.Bool("awq-duo")}
	if opt.Experts, err = convert.ParseExpertCalibration(c.String("moe-calib"), c.Int("moe-min-tokens")); err != nil {
		return opt, err
	}
	opt.OutputProbe = c.Bool("output-probe")
	opt.Calib = convert.CalibOptions{File: c.String("calib"), Samples: c.Int("calib-samples"), SeqLen: c.Int("calib-seqlen")}
	if opt.Calib.File != "" { // calibration runs forward passes
		noteSlowPath(c.App.ErrWriter)
	}
	opt.GGUF = convert.GGUFOptions{Preset: c.String("preset"), EmbedType: c.String("embed-type"), OutputType: c.String("output-type"),
		TokenizerPre: c.String("tokenizer-pre")}
	planning := []string{"plan", "scheme", "bits", "group-size", "sym", "asym", "strategy", "ladder", "override", "target-bpw", "target-size"}
	switch {
	case opt.GGUF.Preset != "" && anySet(c, planning...):
		return opt, fmt.Errorf("--preset chooses every tensor's type as llama-quantize does; drop --%s", firstSet(c, planning...))
	case opt.Format == "gguf" && opt.GGUF.Preset == "" && !anySet(c, planning...):
		opt.GGUF.Preset = "Q4_K_M"
	}
	if opt.GGUF.Preset != "" {
		return opt, nil // the preset says what each tensor becomes
	}
	if p := c.String("plan"); p != "" {
		f, err := os.Open(p)
		if err != nil {
			return opt, err
		}
		defer f.Close()
		if opt.Plan, err = alloc.ReadPlan(f); err != nil {
			return opt, fmt.Errorf("%s: %w", p, err)
		}
		return opt, nil
	}
	s, err := schemeFromFlags(c)
	if err != nil {
		return opt, err
	}
	if opt.Format == "gguf" && !anySet(c, "scheme", "bits", "group-size", "sym", "asym") {
		s, _ = quant.ParseScheme("q4_k") // the integer default is no ggml type
	}
	strategy, err := strategyFromFlags(c)
	if err != nil {
		return opt, err
	}
	a := alloc.Options{Strategy: strategy, QuantizeEmbeddings: c.Bool("quantize-embeddings"),
		QuantizeHead: c.Bool("quantize-head"), TargetBPW: c.Float64("target-bpw")}
	if a.Ladder, err = ladderFromFlags(c, a.Strategy, s, opt.Format); err != nil {
		return opt, err
	}
	if a.Overrides, err = alloc.ParseOverrides(c.StringSlice("override")); err != nil {
		return opt, err
	}
	if v := c.String("target-size"); v != "" {
		if a.TargetBytes, err = parseSize(v); err != nil {
			return opt, fmt.Errorf("--target-size: %w", err)
		}
	}
	opt.Alloc = a
	return opt, nil
}

// anySet says whether any of the flags was given.
func anySet(c *cli.Context, flags ...string) bool { return firstSet(c, flags...) != "" }

// firstSet is the first of the flags that was given, or "".
func firstSet(c *cli.Context, flags ...string) string {
	for _, f := range flags {
		if c.IsSet(f) {
			return f
		}
	}
	return ""
}

// strategyFromFlags reads --strategy; a budget (--target-bpw or --target-size) implies the
// budget strategy when no strategy was given, and contradicts any other: a budget silently
// ignored by a uniform plan surprised users.
func strategyFromFlags(c *cli.Context) (string, error) {
	s := c.String("strategy")
	budget := ""
	for _, f := range []string{"target-bpw", "target-size"} {
		if c.IsSet(f) {
			budget = "--" + f
		}
	}
	switch {
	case budget == "" || s == alloc.StrategyBudget:
		return s, nil
	case c.IsSet("strategy"):
		return "", fmt.Errorf("%s needs --strategy budget, not --strategy %s (leave --strategy out to imply budget)", budget, s)
	}
	fmt.Fprintf(c.App.ErrWriter, "note: %s implies --strategy budget\n", budget)
	return alloc.StrategyBudget, nil
}

// ladderFromFlags: --ladder when given; otherwise uniform uses the scheme and evolved the scheme
// and its 8-bit version (Q8_0 in GGUF); a budget plan leaves the ladder to convert (the format's
// and the method's default).
func ladderFromFlags(c *cli.Context, strategy string, s quant.Scheme, format string) ([]alloc.Choice, error) {
	if l := c.String("ladder"); l != "" {
		return alloc.ParseLadder(l)
	}
	switch strategy {
	case alloc.StrategyUniform:
		return []alloc.Choice{alloc.SchemeChoice(s)}, nil
	case alloc.StrategyEvolved:
		high := s
		high.Bits, high.Grid = 8, quant.Integer
		if format == "gguf" {
			high = quant.Scheme{Bits: 8, GroupSize: 32, Sym: true} // Q8_0
		}
		return []alloc.Choice{alloc.SchemeChoice(s), alloc.SchemeChoice(high)}, nil
	case alloc.StrategyBudget:
		return nil, nil
	}
	return nil, fmt.Errorf("--strategy %q: want uniform, evolved or budget", strategy)
}

// schemeFromFlags reads --scheme, or --bits/--group-size/--sym/--asym.
func schemeFromFlags(c *cli.Context) (quant.Scheme, error) {
	if c.Bool("sym") && c.Bool("asym") {
		return quant.Scheme{}, fmt.Errorf("--sym and --asym contradict each other")
	}
	if name := c.String("scheme"); name != "" {
		if c.IsSet("bits") || c.IsSet("group-size") || c.IsSet("sym") || c.IsSet("asym") {
			return quant.Scheme{}, fmt.Errorf("--scheme replaces --bits, --group-size, --sym and --asym; give one or the other")
		}
		return quant.ParseScheme(name)
	}
	g := c.Int("group-size")
	if g < 0 {
		g = quant.PerChannel
	}
	s := quant.Scheme{Bits: c.Int("bits"), GroupSize: g, Sym: !c.Bool("asym"), Grid: quant.Integer}
	return s, s.Validate()
}

// parseSize reads sizes like 5GB, 500MB, 2GiB or a plain byte count.
func parseSize(v string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	u := strings.ToUpper(strings.TrimSpace(v))
	mult := int64(1)
	for _, x := range units {
		if strings.HasSuffix(u, x.suffix) {
			u, mult = strings.TrimSpace(strings.TrimSuffix(u, x.suffix)), x.mult
			break
		}
	}
	f, err := strconv.ParseFloat(u, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("invalid size %q (want e.g. 5GB or 500MB)", v)
	}
	return int64(f * float64(mult)), nil
}

func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// useOnlyGPUs shows the driver only the GPUs a command will use (cuda.UseOnly), when it names
// them (nil: every GPU) and may run on a GPU: loading the driver costs about 0.2 s for every GPU
// it sees, used or not.
func useOnlyGPUs(device string, ordinals []int) error {
	if device == cuda.ChoiceCPU || len(ordinals) == 0 {
		return nil
	}
	return cuda.UseOnly(ordinals)
}

// parseDevices reads --devices: "all" (nil) or distinct GPU ordinals separated by commas.
func parseDevices(v string) ([]int, error) {
	if v == "all" || v == "" {
		return nil, nil
	}
	var ords []int
	for _, f := range strings.Split(v, ",") {
		o, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || o < 0 {
			return nil, fmt.Errorf("--devices %q: want all or GPU ordinals like 0,1", v)
		}
		if slices.Contains(ords, o) {
			return nil, fmt.Errorf("--devices %q: GPU %d is named twice", v, o)
		}
		ords = append(ords, o)
	}
	return ords, nil
}
