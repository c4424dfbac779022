// Package blockwise quantizes a weight matrix group by group (no error feedback): round-to-nearest per
// group on the integer, NF4, FP8, binary, k-quant and IQ grids, optionally with the GPTQ reference
// quantizer's MSE-optimal clipping search or an importance-weighted scale search.
//
// How each code is computed (a GPU kernel must reproduce these bit for bit); w is the float32
// weight, all arithmetic float32 unless noted, round = round half to even:
//
//	Integer: xmin = min(group, 0), xmax = max(group, 0) (symmetric: ±max|group|), shrunk by p;
//	         scale = F16(( xmax − xmin)/maxq), zero = clamp(round(−xmin/scale), 0, maxq) or 2^(bits−1)
//	         (quant.IntParamsRange); code = clamp(round(w/scale) + zero, 0, maxq) with a true division.
//	NF4:     scale = F16(p·max|group|) (1 for an all-zero group); code = quant.NF4Code(w/scale).
//	FP8:     scale = p·max|row|/448 (float32, 1 for an all-zero row); code = E4M3FN(w/scale), saturating.
//	Binary:  offset = F16(mean(group)) (0 when symmetric), scale = F16(p·mean|w − offset|) with the
//	         means in float64; code = 1 when w − offset ≥ 0, else 0.
//	K-quant: ggml's fitting of each super-block of 256 weights of a row (package kquant):
//	         quantize_row_qX_K_ref, or quantize_row_qX_K_impl with Options.Importance.
//	IQ:      ggml's IQ quantizers on each block of a row (package iquant), with
//	         Options.Importance as their imatrix.
//
// p = 1 unless Options.Clip chose a smaller one. Options.Imatrix instead searches the parameters
// that minimise the importance-weighted squared error (weighted.go): shrunk ranges as above plus
// weighted least-squares refits of the scale and zero, so its scales need not be a range/maxq.
// Groups run along K; the last may be partial.
package blockwise

import (
	"fmt"
	"math"
	"runtime"

	"github.com/qpack-dev/qpack/internal/shares"
	"github.com/qpack-dev/qpack/quant"
)

// Options change how groups are fitted. The zero value is plain round-to-nearest.
type Options struct {
	// Clip searches, per group, the range shrink p = 1 − i/100 (i = 0..79) that minimises
	// Σ imp_k·|Q(w) − w|^2.4 (GPTQ reference, mse=True). Asymmetric integer grids recompute the
	// zero point per candidate; symmetric ones keep it.
	Clip bool
	// Imatrix searches, per group, the parameters minimising Σ imp_k·(w_k − ŵ_k)² (squared
	// error weighted by Importance, plain squared error without it): shrunk ranges and weighted
	// least-squares refits of the scale (and zero), see weightedSearch. It replaces Clip's search
	// when both are set. Every grid takes it; integer and NF4 groups also get the refit.
	// K-quants fit every super-block with ggml's search anyway; Importance (which needs
	// Imatrix) switches it to ggml's imatrix variant.
	Imatrix bool
	// Importance, when set, weights the clip or weighted search per input channel (length K,
	// finite, ≥ 0), e.g. the mean x² of each input channel over calibration data (llama.cpp's
	// imatrix). It needs Clip or Imatrix.
	Importance []float32
	// Params, when set, are every group's parameters, found beforehand (GPUImatrix runs the
	// imatrix search on a GPU); the groups are then only encoded with them. Integer grids.
	Params *FittedGroups
	// GlobalScale is the global scale of an NVFP4 tensor (quant.Tensor.GlobalScale), e.g. one
	// shared by q, k and v as vLLM wants it; 0 computes it from W's largest |w|
	// (quant.NVFP4GlobalScale). Other grids take none.
	GlobalScale float32
}

// FittedGroups are the scale and zero point of every group of an integer-grid tensor, row by
// row (N × groups, the layout of quant.Tensor's Scales and Zeros).
type FittedGroups struct {
	Scales []float32
	Zeros  []uint8
}

// Quantize quantizes W[n, k] (float32, row-major) under scheme s. Errors name the row and
// column of a NaN or infinite weight (the caller adds the tensor's name).
func Quantize(w []float32, n, k int, s quant.Scheme, opt Options) (*quant.Tensor, error) {
	t := new(quant.Tensor)
	if err := QuantizeInto(t, w, n, k, s, opt); err != nil {
		return nil, err
	}
	return t, nil
}

// QuantizeInto is Quantize writing into dst, reusing its slices when they are large enough
// (GIdx is set to nil). On error dst's contents are unspecified.
func QuantizeInto(dst *quant.Tensor, w []float32, n, k int, s quant.Scheme, opt Options) error {
	if len(w) != n*k {
		return fmt.Errorf("blockwise: %d weights for a %dx%d tensor", len(w), n, k)
	}
	return quantizeRows(dst, float32Rows{w: w, k: k}, n, k, s, opt, nil)
}

// QuantizeBF16 quantizes W[n, k] given as raw little-endian BF16 bytes (as stored in a
// safetensors file), converting one row at a time so that no float32 copy of W is made.
func QuantizeBF16(raw []byte, n, k int, s quant.Scheme, opt Options) (*quant.Tensor, error) {
	t := new(quant.Tensor)
	if err := QuantizeBF16Into(t, raw, n, k, s, opt); err != nil {
		return nil, err
	}
	return t, nil
}

// QuantizeBF16Into is QuantizeBF16 writing into dst, reusing its slices.
func QuantizeBF16Into(dst *quant.Tensor, raw []byte, n, k int, s quant.Scheme, opt Options) error {
	if len(raw) != 2*n*k {
		return fmt.Errorf("blockwise: %d bytes of BF16 for a %dx%d tensor (want %d)", len(raw), n, k, 2*n*k)
	}
	return quantizeRows(dst, bf16Rows{raw: raw, k: k}, n, k, s, opt, nil)
}

// rowBlock is how many output rows a goroutine quantizes before handing their codes to a
// blockSink: 16 rows of 4-bit GPTQ words fill one 64-byte line of each word row.
const rowBlock = 16

// blockSink takes the codes of output rows r0 … r0+len(codes)/k−1, just quantized, e.g. to pack
// them while they are in cache. It is called from several goroutines at once.
type blockSink func(r0 int, codes []uint8) error

// quantizeRows checks the arguments, sizes dst and quantizes the rows on GOMAXPROCS goroutines,
// each with its own buffers and a contiguous run of blocks of rowBlock rows (handing blocks out
// in turn measured 10% slower with a packing sink, likely as two cores then write neighbouring
// cache lines of the packed output). Without a sink the codes go to dst.Codes; with one, to a block buffer handed
// to sink, and dst.Codes is left empty. On error the lowest failing row is reported.
func quantizeRows(dst *quant.Tensor, src rowSource, n, k int, s quant.Scheme, opt Options, sink blockSink) error {
	if err := checkArgs(n, k, s, opt); err != nil {
		return err
	}
	if (s.Grid == quant.KQuant || s.Grid == quant.IQuant || s.Grid == quant.FP8Block) && sink != nil {
		return fmt.Errorf("blockwise: %s codes are not packed in the GPTQ layout", s)
	}
	if s.Grid == quant.FP8Block {
		return quantizeFP8Blocks(dst, src, n, k, s)
	}
	if s.Grid == quant.NVFP4 && opt.GlobalScale == 0 {
		amax, err := tensorAbsMax(src, n, k)
		if err != nil {
			return err
		}
		opt.GlobalScale = quant.NVFP4GlobalScale(amax)
	}
	resize(dst, n, k, s, sink == nil)
	dst.GlobalScale = opt.GlobalScale
	quantize, bufLen := rowQuantizerFor(s, k, opt)
	blocks := (n + rowBlock - 1) / rowBlock
	return shares.Runs(blocks, min(runtime.GOMAXPROCS(0), blocks, max(1, n*k/(1<<16))), func(lo, hi int) error {
		buf := make([]float32, bufLen)
		var block []uint8
		if sink != nil {
			block = make([]uint8, rowBlock*k)
		}
		for b := lo; b < hi; b++ {
			if err := quantizeBlock(dst, quantize, src, b*rowBlock, min((b+1)*rowBlock, n), block, buf, sink); err != nil {
				return err
			}
		}
		return nil
	})
}

// quantizeBlock quantizes rows r0 … r1−1 into dst.Codes or, with a sink, into block (len ≥
// (r1−r0)·k), which it then hands to the sink. A lattice IQ tensor has no codes (its row fitter
// stores grid points): its rows get none.
func quantizeBlock(dst *quant.Tensor, quantize rowQuantizer, src rowSource, r0, r1 int, block []uint8, buf []float32, sink blockSink) error {
	k := dst.K
	codes := block
	if sink == nil {
		codes = dst.Codes[min(r0*k, len(dst.Codes)):]
	}
	codes = codes[:min((r1-r0)*k, len(codes))]
	for row := r0; row < r1; row++ {
		var rowCodes []uint8
		if len(codes) > 0 {
			rowCodes = codes[(row-r0)*k : (row-r0+1)*k]
		}
		if err := quantize(dst, src, row, rowCodes, buf); err != nil {
			return err
		}
	}
	if sink == nil {
		return nil
	}
	return sink(r0, codes)
}

// groupLen is the number of input channels per group (the last group may be shorter).
func groupLen(s quant.Scheme, k int) int {
	if s.GroupSize == quant.PerChannel || s.GroupSize > k {
		return k
	}
	return s.GroupSize
}

func checkArgs(n, k int, s quant.Scheme, opt Options) error {
	if n <= 0 || k <= 0 {
		return fmt.Errorf("blockwise: tensor shape %dx%d must be positive", n, k)
	}
	if err := s.Validate(); err != nil {
		return fmt.Errorf("blockwise: %w", err)
	}
	if err := checkRowLength(k, s, opt); err != nil {
		return err
	}
	if p := opt.Params; p != nil {
		if ng := n * s.Groups(k); s.Grid != quant.Integer || len(p.Scales) != ng || len(p.Zeros) != ng {
			return fmt.Errorf("blockwise: %d scales and %d zero points given for %s with %d groups (integer grids only)", len(p.Scales), len(p.Zeros), s, ng)
		}
	}
	if opt.Importance == nil {
		return nil
	}
	if !opt.Clip && !opt.Imatrix {
		return fmt.Errorf("blockwise: importance weights are only used by the clip or weighted search; set Clip or Imatrix")
	}
	if len(opt.Importance) != k {
		return fmt.Errorf("blockwise: %d importance weights for %d input channels", len(opt.Importance), k)
	}
	for i, v := range opt.Importance {
		if !(v >= 0) || math.IsInf(float64(v), 1) {
			return fmt.Errorf("blockwise: importance of input channel %d is %g; want finite and ≥ 0", i, v)
		}
	}
	return nil
}

// resize makes dst an n×k tensor of scheme s, keeping slice capacity; its codes are empty
// unless withCodes.
func resize(dst *quant.Tensor, n, k int, s quant.Scheme, withCodes bool) {
	if s.Grid == quant.KQuant {
		*dst = *quant.NewKQuantTensor(s, n, k)
		return
	}
	if s.Grid == quant.IQuant {
		*dst = *quant.NewIQuantTensor(s, n, k)
		return
	}
	ng := n * s.Groups(k)
	dst.Scheme, dst.N, dst.K, dst.GIdx = s, n, k, nil
	dst.Mins, dst.SubScales, dst.SubMins, dst.Points, dst.Signs = nil, nil, nil, nil, nil
	dst.Codes = dst.Codes[:0]
	if withCodes {
		dst.Codes = grow(dst.Codes, n*k)
	}
	dst.Scales = grow(dst.Scales, ng)
	dst.Zeros = dst.Zeros[:0]
	if s.Grid == quant.Integer {
		dst.Zeros = grow(dst.Zeros, ng)
	}
	dst.Offsets = dst.Offsets[:0]
	if s.Grid == quant.Binary && !s.Sym {
		dst.Offsets = grow(dst.Offsets, ng)
	}
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// quantizeRow quantizes row `row` of dst group by group into codes (len k) and dst's
// parameters, each group's weights read from src into buf (len groupLen) so that they stay in
// the L1 cache from conversion to encoding.
func quantizeRow(dst *quant.Tensor, q groupQuantizer, src rowSource, row int, codes []uint8, buf []float32, opt Options) error {
	for g := range dst.Scheme.Groups(dst.K) {
		if err := quantizeGroup(dst, q, src, row, g, codes, buf, opt); err != nil {
			return err
		}
	}
	return nil
}

// quantizeGroup is quantizeRow for group g of the row alone.
func quantizeGroup(dst *quant.Tensor, q groupQuantizer, src rowSource, row, g int, codes []uint8, buf []float32, opt Options) error {
	k := dst.K
	gs := groupLen(dst.Scheme, k)
	groups := dst.Scheme.Groups(k)
	lo, hi := g*gs, min((g+1)*gs, k)
	w, r := src.spanned(row, lo, hi, buf)
	if !r.finite() {
		col := firstNonFinite(w)
		return fmt.Errorf("weight at row %d, column %d is %g", row, lo+col, w[col])
	}
	var gimp []float32
	if opt.Importance != nil {
		gimp = opt.Importance[lo:hi]
	}
	i := row*groups + g
	var pr params
	if p := opt.Params; p != nil {
		pr = params{scale: p.Scales[i], zero: p.Zeros[i], small: r.absMax() < p.Scales[i]*(1<<20)}
	} else {
		pr = fitGroup(q, w, r, gimp, codes[lo:hi], opt)
	}
	if !finite(pr.scale) || !finite(pr.offset) {
		return rowError(src, row, hi, k, buf, fmt.Errorf("row %d, group %d: scale %g or offset %g is not finite in F16 (weights too large)", row, g, pr.scale, pr.offset))
	}
	q.encode(codes[lo:hi], w, pr)
	dst.Scales[i] = pr.scale
	if len(dst.Zeros) > 0 {
		dst.Zeros[i] = pr.zero
	}
	if len(dst.Offsets) > 0 {
		dst.Offsets[i] = pr.offset
	}
	return nil
}

// rowError returns the error for the first non-finite weight of row `row` at or after column
// from, or err when there is none: a NaN or infinity is the root cause to report, wherever it is.
func rowError(src rowSource, row, from, k int, buf []float32, err error) error {
	for lo := from; lo < k; lo += len(buf) {
		hi := min(lo+len(buf), k)
		w := src.segment(row, lo, hi, buf)
		if col := firstNonFinite(w); col >= 0 {
			return fmt.Errorf("weight at row %d, column %d is %g", row, lo+col, w[col])
		}
	}
	return err
}

func fitGroup(q groupQuantizer, w []float32, r span, imp []float32, codes []uint8, opt Options) params {
	if opt.Imatrix {
		if se, ok := q.(scaleEnumerator); ok {
			return scaleSearch(q, se, w, r, imp, codes)
		}
		return weightedSearch(q, w, r, imp, codes)
	}
	if opt.Clip {
		return clipSearch(q, w, r, imp, codes)
	}
	return q.fit(w, r, 1)
}

func finite(f float32) bool { return !math.IsInf(float64(f), 0) && f == f }

// firstNonFinite returns the index of the first NaN or ±Inf in w, or −1.
func firstNonFinite(w []float32) int {
	for i, v := range w {
		if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
			return i
		}
	}
	return -1
}
