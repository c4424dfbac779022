package convert

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/qpack-dev/qpack/alloc"
	"github.com/qpack-dev/qpack/ftype"
	"github.com/qpack-dev/qpack/ggmltype"
	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// GGUFOptions say how --format gguf writes the file around the plan: one GGUF file for
// llama.cpp with a ggml type per tensor.
type GGUFOptions struct {
	// Preset is a llama.cpp file type (Q4_K_M, Q3_K_S, …): every tensor gets the type
	// llama-quantize gives it under that type (package ftype), in place of a strategy.
	Preset string
	// EmbedType and OutputType are the ggml types of token_embd and output; empty takes
	// llama.cpp's default for the file type (the preset's; otherwise the k-quant file type of the
	// plan's scheme or of a budget's bits per weight).
	EmbedType, OutputType string
	// TokenizerPre overrides the detected tokenizer.ggml.pre; Name is general.name.
	TokenizerPre, Name string
}

// lookupFormat resolves --format: a checkpoint layout, or gguf.
func lookupFormat(name string) (packing.Format, error) {
	if name == "gguf" {
		return packing.GGUF{}, nil
	}
	f, err := packing.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w, or gguf", err)
	}
	return f, nil
}

func isGGUF(f packing.Format) bool { _, ok := f.(packing.GGUF); return ok }

// checkGGUF refuses, before anything is read, GGUF settings that contradict each other, and
// sets the ladder's default and the format's fallbacks.
func (o *Options) checkGGUF(f packing.Format) error {
	g := o.GGUF
	if !isGGUF(f) {
		if g != (GGUFOptions{}) {
			return fmt.Errorf("--preset, --embed-type, --output-type and --tokenizer-pre are for --format gguf")
		}
		return nil
	}
	if o.Alloc.QuantizeEmbeddings || o.Alloc.QuantizeHead {
		return fmt.Errorf("--format gguf quantizes token_embd and output by --embed-type and --output-type, not --quantize-embeddings/--quantize-head")
	}
	for _, t := range []struct{ flag, name string }{{"--embed-type", g.EmbedType}, {"--output-type", g.OutputType}} {
		if t.name == "" {
			continue
		}
		if _, err := floatTypeOf(t.name); err != nil {
			return fmt.Errorf("%s: %w", t.flag, err)
		}
	}
	if g.Preset != "" {
		ft, err := ftype.Parse(g.Preset)
		if err != nil {
			return fmt.Errorf("--preset: %w", err)
		}
		switch {
		case o.Plan != nil:
			return fmt.Errorf("--preset and --plan both say what each tensor becomes: give one")
		case o.Alloc.Strategy != alloc.StrategyUniform || len(o.Alloc.Overrides) > 0 || o.Alloc.TargetBPW > 0 || o.Alloc.TargetBytes > 0:
			return fmt.Errorf("--preset %s chooses every tensor's type as llama-quantize does: it takes no --strategy, --override or budget", ft)
		case !isBlockType(ft.Base()):
			return fmt.Errorf("--preset %s quantizes nothing: write float GGUF files with `qpack export gguf --type %s`", ft, strings.ToLower(ft.String()))
		}
		base, ok := ggmltype.SchemeOf(ft.Base())
		if !ok {
			return fmt.Errorf("--preset %s: its %s tensors need a type qpack does not write yet", ft, ft.Base())
		}
		o.Alloc.Ladder = []alloc.Choice{alloc.SchemeChoice(base)} // the overrides come when the model is read
	}
	o.Alloc.Fallback = ggufFallback
	return nil
}

func isBlockType(t gguf.Type) bool { return t.BlockSize() > 1 }

// floatTypeOf reads a ggml type that token_embd or output may take: F32, F16, BF16, or a
// block type qpack quantizes float weights to with ggml's reference quantizers.
func floatTypeOf(name string) (gguf.Type, error) {
	t, err := gguf.ParseType(name)
	if err != nil {
		return 0, err
	}
	if _, ok := ggmltype.SchemeOf(t); !ok && !slices.Contains(gguf.Encoders, t) {
		return 0, fmt.Errorf("qpack writes token_embd and output in F32, F16, BF16, %s, Q4_1 or Q5_1, not %s", ggmltype.Names(), t)
	}
	return t, nil
}

// ggufLadder is the default ladder under --format gguf: uniform q4_k, evolved q4_k with q6_k
// at the edges, budget every ggml type the method can produce.
func (o *Options) ggufLadder() []alloc.Choice {
	q4k, _ := ggmltype.SchemeOf(gguf.Q4_K)
	q6k, _ := ggmltype.SchemeOf(gguf.Q6_K)
	switch o.Alloc.Strategy {
	case alloc.StrategyUniform:
		return []alloc.Choice{alloc.SchemeChoice(q4k)}
	case alloc.StrategyEvolved:
		return []alloc.Choice{alloc.SchemeChoice(q4k), alloc.SchemeChoice(q6k)}
	}
	var ladder []alloc.Choice
	for _, r := range ggmltype.Rungs() {
		if o.Method.Takes(r.Scheme, *o) == nil {
			ladder = append(ladder, alloc.SchemeChoice(r.Scheme))
		}
	}
	return ladder
}

// ggufFallback is alloc's Fallback for GGUF: llama.cpp's substitutes for a type whose blocks
// do not divide the rows (ggmltype.Fallback), and F16 (keep) when none fits.
func ggufFallback(s quant.Scheme, n, k int) (alloc.Choice, string, error) {
	t, ok := ggmltype.TypeOf(s)
	if !ok {
		return alloc.Choice{}, "", ggmltype.Supports(s)
	}
	sub, why, ok := ggmltype.Fallback(t, k)
	switch {
	case !ok:
		return alloc.Keep, why, nil
	case sub == t:
		return alloc.SchemeChoice(s), "", nil
	}
	ss, _ := ggmltype.SchemeOf(sub)
	return alloc.SchemeChoice(ss), why, nil
}

// ggufPlan is what a GGUF conversion knows once the checkpoint is open: its layout, and the
// types llama-quantize's rules give each tensor under the file type (the preset's, or the
// default one that names token_embd's and output's types).
type ggufPlan struct {
	layout        *ggufexport.Layout
	fileType      ftype.FileType
	preset        bool
	types         map[string]gguf.Type // by GGUF name, under fileType
	embed, output gguf.Type
	roleOf        map[string]ggufexport.Role // by Hugging Face name (an expert's: its merged tensor's)
	expertOf      map[string]int             // an expert's place in its merged tensor, by Hugging Face name
	name          string                     // general.name
	warnings      []string
}

// prepareGGUF reads the layout (config and tokenizer), works out the file type's per-tensor
// types and the types of token_embd and output, and checks that they fit, all before any
// expensive work.
func prepareGGUF(ck *safetensors.Checkpoint, opt *Options) (*ggufPlan, error) {
	l, err := ggufexport.NewLayout(ck.Dir, opt.GGUF.TokenizerPre, func(name string) bool { _, ok := ck.Info(name); return ok })
	if err != nil {
		return nil, err
	}
	p := &ggufPlan{layout: l, roleOf: map[string]ggufexport.Role{}, expertOf: map[string]int{}, name: opt.GGUF.Name}
	var tensors []ftype.Tensor
	for _, r := range l.Roles() {
		shape, ok, err := p.addRole(ck, r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ck.Dir, err)
		}
		if !ok {
			continue
		}
		typ := gguf.F16
		if len(shape) < 2 {
			typ = gguf.F32
		}
		tensors = append(tensors, ftype.Tensor{Name: r.GGUF, Type: typ, Dims: r.Dims(shape)})
	}
	if err := p.checkNames(ck); err != nil {
		return nil, err
	}
	opt.Alloc.Tie = p.mergedTensorOf // ggml holds a block's experts in one tensor of one type
	if opt.Plan != nil {
		descs, err := describe(ck)
		if err == nil {
			err = checkReplayed(opt.Plan, descs)
		}
		if err == nil {
			err = p.checkReplayedExperts(opt.Plan)
		}
		if err != nil {
			return nil, err
		}
	}
	if p.fileType, p.preset, err = fileTypeFor(opt); err != nil {
		return nil, err
	}
	fo := ftype.Options{Imatrix: opt.Imatrix || opt.Method.Calibrates() || opt.importance != nil}
	if opt.GGUF.EmbedType != "" {
		t, _ := floatTypeOf(opt.GGUF.EmbedType)
		fo.EmbedType = &t
	}
	if opt.GGUF.OutputType != "" {
		t, _ := floatTypeOf(opt.GGUF.OutputType)
		fo.OutputType = &t
	}
	choices, err := ftype.Choose(p.fileType, l.FTypeModel(), tensors, fo)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ck.Dir, err)
	}
	p.types = map[string]gguf.Type{}
	for _, c := range choices {
		p.types[c.Name] = c.Type
	}
	if p.preset && !fo.Imatrix {
		if ftype.RequiresImatrix(p.fileType) {
			return nil, fmt.Errorf("--preset %s needs an importance matrix, as in llama-quantize: add --imatrix with --calib, --imatrix-file, or use --method gptq", p.fileType)
		}
		for _, c := range choices {
			if c.Quantize && ftype.NeedsImatrix(p.fileType, c.Name, c.Type) {
				return nil, fmt.Errorf("--preset %s: %s in %s without an importance matrix gives garbage (llama-quantize refuses it too): add --imatrix with --calib, --imatrix-file, or use --method gptq", p.fileType, c.Name, c.Type)
			}
		}
	}
	p.embed, p.output = p.types["token_embd.weight"], p.types["output.weight"]
	for _, t := range []*gguf.Type{&p.embed, &p.output} {
		if *t == 0 || encodable(*t) {
			continue
		}
		sub, ok := standIns[*t]
		if !ok {
			return nil, fmt.Errorf("%s gives token_embd/output %s, which qpack does not write yet: choose --embed-type and --output-type", p.fileType, *t)
		}
		p.warnings = append(p.warnings, fmt.Sprintf("%s gives token_embd/output %s; qpack writes %s", p.fileType, *t, sub))
		*t = sub
	}
	if p.preset {
		err = p.presetOverrides(ck, opt)
	}
	return p, err
}

// addRole records the role's Hugging Face tensors and returns the shape of one of them (for a
// merged tensor, of one expert; every expert must have it); ok is false for an optional tensor
// the checkpoint lacks.
func (p *ggufPlan) addRole(ck *safetensors.Checkpoint, r ggufexport.Role) (shape []int, ok bool, err error) {
	if r.Experts == nil {
		p.roleOf[r.HF] = r
		info, ok := ck.Info(r.HF)
		if !ok && !r.Optional {
			return nil, false, fmt.Errorf("tensor %s (for %s) is missing", r.HF, r.GGUF)
		}
		return info.Shape, ok, nil
	}
	for e, hf := range r.Experts {
		p.roleOf[hf], p.expertOf[hf] = r, e
		info, ok := ck.Info(hf)
		switch {
		case !ok:
			return nil, false, fmt.Errorf("tensor %s (expert %d of %s) is missing", hf, e, r.GGUF)
		case e == 0:
			shape = info.Shape
		case !slices.Equal(info.Shape, shape):
			return nil, false, fmt.Errorf("%s: expert %d (%s) has shape %v, expert 0 %v", r.GGUF, e, hf, info.Shape, shape)
		}
	}
	return shape, true, nil
}

// mergedTensorOf names the merged tensor an expert's weight is written into ("" for other
// tensors): alloc ties the experts of one merged tensor to one choice.
func (p *ggufPlan) mergedTensorOf(hf string) string {
	if r := p.roleOf[hf]; r.Experts != nil {
		return r.GGUF
	}
	return ""
}

// checkReplayedExperts refuses a replayed plan that gives the experts of one merged tensor
// different schemes, naming two of them.
func (p *ggufPlan) checkReplayedExperts(plan *alloc.Plan) error {
	for _, r := range p.layout.Roles() {
		for e, hf := range r.Experts {
			a, _ := plan.Lookup(r.Experts[0])
			b, _ := plan.Lookup(hf)
			if a.Scheme != b.Scheme {
				return fmt.Errorf("plan: %s gives expert 0 (%s) %s and expert %d (%s) %s, but llama.cpp holds a block's experts in one tensor of one type",
					r.GGUF, r.Experts[0], a.Scheme, e, hf, b.Scheme)
			}
		}
	}
	return nil
}

// namesPattern is a regular expression matching exactly the role's Hugging Face tensors.
func namesPattern(r ggufexport.Role) string {
	if r.Experts == nil {
		return "^" + regexp.QuoteMeta(r.HF) + "$"
	}
	quoted := make([]string, len(r.Experts))
	for i, n := range r.Experts {
		quoted[i] = regexp.QuoteMeta(n)
	}
	return "^(?:" + strings.Join(quoted, "|") + ")$"
}

// encodable says whether qpack writes float weights in type t.
func encodable(t gguf.Type) bool {
	_, ok := ggmltype.SchemeOf(t)
	return ok || slices.Contains(gguf.Encoders, t)
}

// checkNames refuses checkpoint tensors the GGUF layout has no place for (a tied lm_head
// copy is dropped, as convert_hf_to_gguf.py does).
func (p *ggufPlan) checkNames(ck *safetensors.Checkpoint) error {
	for _, name := range ck.Names() {
		if _, ok := p.roleOf[name]; !ok && !(name == "lm_head.weight" && p.layout.Config.TieEmbeddings) {
			return fmt.Errorf("%s: tensor %s has no place in llama.cpp's %s layout", ck.Dir, name, p.layout.Arch)
		}
	}
	return nil
}

// fileTypeFor is the file type whose rules name the types: the preset, or the k-quant file
// type of a uniform or evolved plan's lowest rung, of the largest k-quant under a budget's bits
// per weight, or Q4_K_M.
func fileTypeFor(opt *Options) (ftype.FileType, bool, error) {
	if opt.GGUF.Preset != "" {
		ft, err := ftype.Parse(opt.GGUF.Preset)
		return ft, true, err
	}
	a := opt.Alloc
	if opt.Plan == nil && len(a.Ladder) > 0 && !a.Ladder[0].Keep && a.Strategy != alloc.StrategyBudget {
		if t, ok := ggmltype.TypeOf(a.Ladder[0].Scheme); ok {
			return ftype.Mostly(t), false, nil
		}
	}
	best := gguf.Q4_K
	if opt.Plan == nil && a.Strategy == alloc.StrategyBudget && a.TargetBPW > 0 {
		best = gguf.Q2_K
		for _, r := range ggmltype.Rungs() {
			if r.Scheme.Grid == quant.KQuant && bitsPerWeight(r.Type) <= a.TargetBPW {
				best = r.Type
			}
		}
	}
	return ftype.Mostly(best), false, nil
}

func bitsPerWeight(t gguf.Type) float64 { return 8 * float64(t.TypeSize()) / float64(t.BlockSize()) }

// presetOverrides pins every decoder linear to the scheme of its preset type; types qpack does
// not write yet (Q4_1, Q5_1) take the rung of the same bits with a warning.
func (p *ggufPlan) presetOverrides(ck *safetensors.Checkpoint, opt *Options) error {
	opt.Alloc.Overrides = nil
	for _, r := range p.layout.Roles() {
		t, ok := p.types[r.GGUF]
		if !ok || !r.Linear {
			continue
		}
		choice := "keep"
		if isBlockType(t) {
			s, ok := ggmltype.SchemeOf(t)
			if !ok {
				sub, known := standIns[t]
				if !known {
					return fmt.Errorf("--preset %s gives %s %s, a type qpack does not write yet", p.fileType, r.GGUF, t)
				}
				p.warnings = append(p.warnings, fmt.Sprintf("preset %s gives %s %s; qpack writes %s", p.fileType, r.GGUF, t, sub))
				s, _ = ggmltype.SchemeOf(sub)
			}
			choice = s.String()
		}
		ov, err := alloc.ParseOverrides([]string{namesPattern(r) + "=" + choice})
		if err != nil {
			return err
		}
		opt.Alloc.Overrides = append(opt.Alloc.Overrides, ov...)
	}
	return opt.checkCandidates(packing.GGUF{}) // the method must produce every preset type
}

// standIns are the types written for llama.cpp's choices qpack lacks: Q4_1 and Q5_1 (for
// decoder linears: qpack fits no grid with an F16 minimum) by the same code width without one.
var standIns = map[gguf.Type]gguf.Type{gguf.Q4_1: gguf.Q4_0, gguf.Q5_1: gguf.Q5_0}

// storedBytes sets what the GGUF file stores each kept tensor in: norms and biases F32,
// token_embd and output their types, other weights F16.
func (p *ggufPlan) storedBytes(descs []alloc.TensorDesc) {
	for i := range descs {
		d := &descs[i]
		r, ok := p.roleOf[d.Name]
		if !ok {
			continue
		}
		d.StoredBytes = p.tensorBytes(r, d.Shape)
	}
}

// typeOf is the GGUF type of a role when the plan keeps it.
func (p *ggufPlan) typeOf(r ggufexport.Role, shape []int) gguf.Type {
	switch {
	case len(shape) < 2 || r.F32:
		return gguf.F32
	case r.GGUF == "token_embd.weight":
		return p.embed
	case r.GGUF == "output.weight":
		return p.output
	}
	return gguf.F16
}

func (p *ggufPlan) tensorBytes(r ggufexport.Role, shape []int) int64 {
	n, _ := gguf.Bytes(p.typeOf(r, shape), ggufexport.Dims(shape))
	return n
}

// annotate names the preset in its plan's reasons, says which ggml type each kept tensor is
// written in, and adds the warnings.
func (p *ggufPlan) annotate(plan *alloc.Plan, descs []alloc.TensorDesc) {
	plan.Warnings = append(plan.Warnings, p.warnings...)
	shapes := map[string][]int{}
	for _, d := range descs {
		shapes[d.Name] = d.Shape
	}
	for i, e := range plan.Entries {
		r, ok := p.roleOf[e.Name]
		switch {
		case !ok:
		case e.Scheme == alloc.KeepName:
			plan.Entries[i].Reason = p.keptReason(r, shapes[e.Name], e.Reason)
		case p.preset && e.Pinned:
			plan.Entries[i].Reason = "preset " + p.fileType.String() + ": llama-quantize's type" + strings.TrimPrefix(e.Reason, strings.SplitN(e.Reason, ";", 2)[0])
		}
	}
}

// keptReason says what type a tensor the plan keeps is written in, and why.
func (p *ggufPlan) keptReason(r ggufexport.Role, shape []int, why string) string {
	t := p.typeOf(r, shape)
	switch {
	case r.GGUF == "token_embd.weight":
		return fmt.Sprintf("%s: --embed-type, or llama.cpp's default under %s", t, p.fileType)
	case r.GGUF == "output.weight":
		return fmt.Sprintf("%s: --output-type, or llama.cpp's default under %s", t, p.fileType)
	case len(shape) < 2:
		return "F32: norms and biases"
	}
	return fmt.Sprintf("%s (%s)", t, why)
}

// checkReplayed refuses a replayed plan's entries whose rows are not whole blocks of their
// type, naming the tensor.
func checkReplayed(plan *alloc.Plan, descs []alloc.TensorDesc) error {
	shapes := map[string][]int{}
	for _, d := range descs {
		shapes[d.Name] = d.Shape
	}
	for _, e := range plan.Entries {
		c, err := e.Choice()
		if err != nil || c.Keep {
			continue
		}
		t, _ := ggmltype.TypeOf(c.Scheme)
		if s := shapes[e.Name]; len(s) == 2 {
			if err := ggmltype.Fits(t, s[1]); err != nil {
				return fmt.Errorf("plan: tensor %s: %s: %w", e.Name, c, err)
			}
		}
	}
	return nil
}

// ggufSink writes the units' tensors into the GGUF file: a quantized weight's ggml blocks
// (rows permuted for llama's q/k), and every kept tensor, which arrives in its input dtype,
// converted to its GGUF type; an expert's weight goes to its place in its merged tensor.
type ggufSink struct {
	w       *gguf.Writer
	plan    *ggufPlan
	fitter  *kquant.GPUFitter            // fits kept tensors of k-quant types (token_embd, output); nil: the CPU does
	dtypes  map[string]safetensors.DType // kept tensors' input dtypes
	shapes  map[string][]int
	packed  map[string]bool  // the packed tensors' names (module prefix + ".weight")
	rowSize map[string]int   // packed tensors' bytes per row
	part    map[string]int64 // a merged tensor's bytes per expert, by GGUF name
}

func (s *ggufSink) Write(name string, data []byte) error {
	r, ok := s.plan.roleOf[name]
	if !ok {
		return fmt.Errorf("tensor %s has no place in the GGUF file", name)
	}
	if s.packed[name] {
		return s.put(r, name, ggufexport.PermuteRows(data, s.rowSize[name], r.Heads))
	}
	shape := s.shapes[name]
	if s.fitsOnGPU(r, name) {
		return s.fitOnGPU(r, name, data)
	}
	v := make([]float32, numel(shape))
	if err := safetensors.DecodeFloat32(s.dtypes[name], v, data); err != nil {
		return fmt.Errorf("tensor %s: %w", name, err)
	}
	if r.Experts != nil {
		var buf bytes.Buffer
		if err := ggufexport.EncodeFloat(&buf, s.plan.typeOf(r, shape), v, shape, r.Heads); err != nil {
			return err
		}
		return s.put(r, name, buf.Bytes())
	}
	tw, err := s.w.Tensor(r.GGUF)
	if err != nil {
		return err
	}
	return ggufexport.EncodeFloat(tw, s.plan.typeOf(r, shape), v, shape, r.Heads)
}

// fitsOnGPU says whether a kept tensor is encoded on the GPU: a matrix of a k-quant type with
// rows of whole super-blocks, stored as BF16, F16 or F32 (token_embd and output under most
// presets; ggml's reference quantizers, no importance, as on the CPU).
func (s *ggufSink) fitsOnGPU(r ggufexport.Role, name string) bool {
	shape := s.shapes[name]
	if s.fitter == nil || r.Experts != nil || len(shape) != 2 || shape[1]%quant.SuperBlock != 0 {
		return false
	}
	scheme, ok := ggmltype.SchemeOf(s.plan.typeOf(r, shape))
	_, dtype := gpuDTypes[s.dtypes[name]]
	return ok && dtype && s.fitter.Supports(scheme)
}

// fitOnGPU encodes a kept tensor's stored bytes as ggml blocks on the GPU: the bytes of
// ggufexport.EncodeFloat.
func (s *ggufSink) fitOnGPU(r ggufexport.Role, name string, data []byte) error {
	shape := s.shapes[name]
	typ := s.plan.typeOf(r, shape)
	scheme, _ := ggmltype.SchemeOf(typ)
	err := s.fitter.FitBlocks(func(dst []byte) error { copy(dst, data); return nil }, gpuDTypes[s.dtypes[name]], shape[0], shape[1], scheme, nil,
		func(blocks []byte) error {
			return s.put(r, name, ggufexport.PermuteRows(blocks, typ.RowBytes(shape[1]), r.Heads))
		})
	if err != nil {
		return fmt.Errorf("tensor %s: %w", name, err)
	}
	return nil
}

// put writes a whole tensor, or an expert's part of its merged tensor.
func (s *ggufSink) put(r ggufexport.Role, name string, data []byte) error {
	if r.Experts == nil {
		return s.w.WriteTensor(r.GGUF, data)
	}
	size := s.part[r.GGUF]
	if int64(len(data)) != size {
		return fmt.Errorf("tensor %s: %d bytes, its part of %s needs %d", name, len(data), r.GGUF, size)
	}
	return s.w.WritePart(r.GGUF, int64(s.plan.expertOf[name])*size, data)
}

// ggufTensors lists the file's tensors in llama.cpp's order with their types, and makes the
// sink that fills them from the units.
func (p *ggufPlan) ggufTensors(items []Item) ([]gguf.Tensor, *ggufSink, error) {
	byName := map[string]Item{}
	for _, it := range items {
		byName[it.Info.Name] = it
	}
	sink := &ggufSink{plan: p, dtypes: map[string]safetensors.DType{}, shapes: map[string][]int{},
		packed: map[string]bool{}, rowSize: map[string]int{}, part: map[string]int64{}}
	var out []gguf.Tensor
	if t, ok := p.layout.RopeFreqs(); ok {
		out = append(out, t)
	}
	for _, r := range p.layout.Roles() {
		names := r.Experts
		if names == nil {
			names = []string{r.HF}
		}
		if _, ok := byName[names[0]]; !ok {
			continue // an optional tensor the checkpoint lacks (prepareGGUF checked the rest)
		}
		var typ gguf.Type
		var shape []int
		for e, hf := range names {
			it := byName[hf]
			shape = it.Info.Shape
			t := p.typeOf(r, shape)
			if it.Scheme != nil {
				t, _ = ggmltype.TypeOf(*it.Scheme)
				sink.packed[hf], sink.rowSize[hf] = true, t.RowBytes(it.K())
			}
			if e > 0 && t != typ { // alloc ties a merged tensor's experts; a replayed plan is checked
				return nil, nil, fmt.Errorf("%s: expert 0 (%s) is %s and expert %d (%s) %s, but llama.cpp holds a block's experts in one tensor of one type",
					r.GGUF, names[0], typ, e, hf, t)
			}
			typ = t
			sink.dtypes[hf], sink.shapes[hf] = it.Info.DType, shape
		}
		dims := r.Dims(shape)
		if r.Experts != nil {
			sink.part[r.GGUF], _ = gguf.Bytes(typ, dims[:len(dims)-1])
		}
		out = append(out, gguf.Tensor{Name: r.GGUF, Type: typ, Dims: dims})
	}
	return out, sink, nil
}

// ggufFileType is general.file_type: the preset's, else named after the most common type of
// the block weights.
func (p *ggufPlan) ggufFileType(tensors []gguf.Tensor) ftype.FileType {
	if p.preset {
		return p.fileType
	}
	var types []gguf.Type
	for _, t := range tensors {
		if strings.HasPrefix(t.Name, "blk.") {
			types = append(types, t.Type)
		}
	}
	return ggufexport.FileTypeOf(types)
}

// provenanceKV is the provenance as a GGUF string KV.
func provenanceKV(meta map[string]string) gguf.KV {
	return gguf.KV{Key: ProvenanceKey, Value: meta[ProvenanceKey]}
}

// ggufReport fixes the report's kept tensors: their bytes and types in the GGUF file.
func (p *ggufPlan) ggufReport(report *Report, tensors []gguf.Tensor) {
	size := map[string]int64{}
	types := map[string]gguf.Type{}
	for _, t := range tensors {
		size[t.Name], _ = gguf.Bytes(t.Type, t.Dims)
		types[t.Name] = t.Type
	}
	for i := range report.Tensors {
		tr := &report.Tensors[i]
		r, ok := p.roleOf[tr.Name]
		if !ok {
			continue
		}
		tr.OutBytes = size[r.GGUF]
		tr.Outputs = []string{fmt.Sprintf("%s (%s)", r.GGUF, types[r.GGUF])}
		if r.Experts != nil { // an expert's share of its merged tensor
			tr.OutBytes /= int64(len(r.Experts))
			tr.Outputs = []string{fmt.Sprintf("%s (%s, expert %d)", r.GGUF, types[r.GGUF], p.expertOf[tr.Name])}
		}
	}
}

// write runs the units into a GGUF file at dst: the header first (the provenance with
// placeholders of the input digests' length), the tensors in any order, then the header again
// with the digests; with sync the file is flushed to disk before it is renamed into place
// (Options.Sync). The report's commit time is that flush and rename.
func (p *ggufPlan) write(dst string, items []Item, units []unit, g *gpu, meta map[string]string, hashes *inputHashes,
	report *Report, metadata func([]InputFile) (map[string]string, error), log io.Writer, sync bool) error {
	tensors, sink, err := p.ggufTensors(items)
	if err != nil {
		return err
	}
	if g != nil {
		sink.fitter = g.kq
	}
	kvs := func(meta map[string]string) []gguf.KV {
		return p.layout.KVs(p.name, p.ggufFileType(tensors), provenanceKV(meta))
	}
	if t, ok := p.layout.RopeFreqs(); ok {
		units = append(units, func(tensorSink) error {
			tw, err := sink.w.Tensor(t.Name)
			if err != nil {
				return err
			}
			return t.WriteTo(tw)
		})
	}
	var filled time.Time
	err = gguf.Stream(dst, kvs(meta), tensors, log, sync, func(w *gguf.Writer) error {
		defer func() { filled = time.Now() }()
		sink.w = w
		if err := runUnits(sink, units, g.workers()); err != nil {
			return err
		}
		inputs, err := hashes.wait()
		if err != nil {
			return err
		}
		report.HashSeconds, report.hashWaitSeconds, report.hashedBytes = hashes.seconds, hashes.waited, hashes.bytes()
		final, err := metadata(inputs)
		if err != nil {
			return err
		}
		return w.SetKVs(kvs(final))
	})
	if err != nil {
		return err
	}
	report.CommitSeconds = time.Since(filled).Seconds()
	p.ggufReport(report, tensors)
	report.Files = []string{dst}
	return nil
}
