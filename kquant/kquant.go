// Package kquant holds llama.cpp's k-quant super-block formats (q2_k … q6_k): ggml's fitting of
// a super-block's scales, mins and codes from its weights and optional importance, quantizing a
// weight with fixed parameters, and ggml's block bytes.
//
// Fitting reproduces ggml-quants.c bit for bit on whole super-blocks of 256 weights: without
// importance quantize_row_qX_K_ref (what llama-quantize runs without an imatrix), with it
// quantize_row_qX_K_impl (with an imatrix, importance = E[x²] of each input channel). A shorter
// last super-block (a whole number of sub-blocks) is fitted by the same steps over its n
// weights. The parameters are what quant.Tensor stores for the grid quant.KQuant.
//
// Round-to-nearest calls QuantizeRow for each row. A method that changes the weights as it goes
// (GPTQ's error feedback) fits each super-block once, from its weights at that moment, and then
// codes weight by weight with those fixed parameters:
//
//	kt, err := kquant.TypeOf(scheme)
//	p, err := kt.Fit(w[lo:hi], imp, codes[lo:hi]) // super-block b = columns lo…hi−1; imp: their
//	                                               // importance (e.g. diag H[lo:hi]) or nil
//	q := kt.Code(&p, j-lo, w[j])                   // column j, after earlier updates
//	wq := kt.Value(&p, j-lo, q)                    // its value, for the error to spread
//	kt.Put(t, row, b, &p)                          // into the quant.Tensor
package kquant

import (
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/quant"
)

// MaxSubBlocks is the most sub-blocks a super-block has (16 of 16 weights).
const MaxSubBlocks = quant.SuperBlock / 16

// Params are one super-block's parameters: F16 super-block scales and one integer scale (and
// min) per sub-block, with the meaning and ranges of quant.Tensor's k-quant fields.
type Params struct {
	D, DMin float32 // F16 values; DMin is 0 for q3_k and q6_k
	Scales  [MaxSubBlocks]int8
	Mins    [MaxSubBlocks]uint8
}

// Type is one k-quant scheme with its fitting.
type Type struct {
	quant.KQuantType
	Scheme quant.Scheme
	maxq   int
	ref    func(t *Type, x []float32, codes []uint8) Params
	impl   func(t *Type, x, qw []float32, codes []uint8) Params
}

var types = map[int]*Type{
	2: {ref: fitMinsRef, impl: fitMinsImpl},
	3: {ref: fitQ3Ref, impl: fitQ3Impl},
	4: {ref: fitMinsRef, impl: fitMinsImpl},
	5: {ref: fitMinsRef, impl: fitMinsImpl},
	6: {ref: func(t *Type, x []float32, c []uint8) Params { return fitQ6(t, x, nil, c) }, impl: fitQ6},
}

func init() {
	for bits, t := range types {
		t.Scheme, _ = quant.KQuantScheme(bits)
		t.KQuantType, _ = t.Scheme.KQuant()
		t.maxq = 1<<bits - 1
	}
}

// TypeOf returns the k-quant type of scheme s.
func TypeOf(s quant.Scheme) (*Type, error) {
	if _, ok := s.KQuant(); !ok || s.Validate() != nil {
		return nil, fmt.Errorf("kquant: %s is not a k-quant scheme (q2_k … q6_k)", s)
	}
	return types[s.Bits], nil
}

// Fit fits one super-block: w holds its weights (a whole number of sub-blocks, at most 256),
// imp their importance (nil for none; finite and ≥ 0), and codes (len(w)) receives their codes.
// Without importance it is ggml's quantize_row_qX_K_ref, with it quantize_row_qX_K_impl.
// Errors name the offending index within the super-block.
func (t *Type) Fit(w, imp []float32, codes []uint8) (Params, error) {
	if err := t.checkBlock(w, imp, codes); err != nil {
		return Params{}, err
	}
	var p Params
	if imp == nil {
		p = t.ref(t, w, codes)
	} else {
		p = t.impl(t, w, imp, codes)
	}
	if err := checkScale(p.D, p.DMin); err != nil {
		return Params{}, err
	}
	return p, nil
}

// checkScale refuses a fitted super-block whose d or dmin overflowed F16.
func checkScale(d, dmin float32) error {
	if !finite(d) || !finite(dmin) {
		return fmt.Errorf("super-block scale d = %g, dmin = %g is not finite in F16 (weights too large)", d, dmin)
	}
	return nil
}

func (t *Type) checkBlock(w, imp []float32, codes []uint8) error {
	n := len(w)
	if n == 0 || n > quant.SuperBlock || n%t.Sub != 0 {
		return fmt.Errorf("kquant: a %s super-block holds whole sub-blocks of %d, at most 256 weights, not %d", t.Scheme, t.Sub, n)
	}
	if len(codes) < n || (imp != nil && len(imp) != n) {
		return fmt.Errorf("kquant: %d weights with %d codes and %d importances", n, len(codes), len(imp))
	}
	for i, v := range w {
		if !finite(v) {
			return fmt.Errorf("weight %d is %g", i, v)
		}
	}
	for i, v := range imp {
		if badImportance(v) {
			return fmt.Errorf("importance %d is %g; want finite and ≥ 0", i, v)
		}
	}
	return nil
}

// badImportance is an importance the fits refuse: negative, NaN or +Inf.
func badImportance(v float32) bool { return !(v >= 0) || math.IsInf(float64(v), 1) }

func finite(v float32) bool { return !math.IsInf(float64(v), 0) && v == v }

// subBlock returns the two factors of sub-block j: dl = d·sc and ml = dmin·m.
func (t *Type) subBlock(p *Params, j int) (dl, ml float32) {
	return t.SubBlock(p.D, p.DMin, p.Scales[j], p.Mins[j])
}

// Code returns the code of weight w at index i of a super-block with fixed parameters p: ggml's
// final step, round((w + dmin·m)/(d·sc)) clamped to the grid (w/(d·sc) + o for the types without
// mins). In a sub-block with d·sc = 0 every code has the same value; Code returns the one
// standing for w − (−ml) = 0 before the min, i.e. code o (0 with mins).
func (t *Type) Code(p *Params, i int, w float32) uint8 {
	dl, ml := t.subBlock(p, i/t.Sub)
	return t.codeIn(w, dl, ml)
}

// codeIn is Code in a sub-block with factors dl and ml.
func (t *Type) codeIn(w, dl, ml float32) uint8 {
	if dl == 0 {
		return uint8(t.Offset)
	}
	return t.code(w, dl, ml)
}

// Round is Code and Value for weight w at row n, column col of the k-quant tensor q, with the
// parameters q holds for that weight's super-block and sub-block (as Put stored them): what a
// column loop that refits only at super-block starts needs for every weight.
func (t *Type) Round(q *quant.Tensor, n, col int, w float32) (code uint8, value float32) {
	subs := q.K / t.Sub
	b, j := n*q.Scheme.SuperBlocks(q.K)+col/quant.SuperBlock, n*subs+col/t.Sub
	var dmin float32
	var m uint8
	if t.Mins {
		dmin, m = q.Mins[b], q.SubMins[j]
	}
	dl, ml := t.SubBlock(q.Scales[b], dmin, q.SubScales[j], m)
	code = t.codeIn(w, dl, ml)
	return code, t.KQuantType.Value(dl, ml, code)
}

func (t *Type) code(w, dl, ml float32) uint8 {
	off := int32(t.Offset)
	l := clamp(NearestInt((w+ml)/dl), -off, int32(t.maxq)-off)
	return uint8(l + off)
}

// Value returns the weight code q at index i of a super-block with parameters p stands for,
// exactly as quant.Tensor.Dequantize and ggml's dequantize_row_qX_K compute it.
func (t *Type) Value(p *Params, i int, q uint8) float32 {
	dl, ml := t.subBlock(p, i/t.Sub)
	return t.KQuantType.Value(dl, ml, q)
}

// requantize is the last step of every quantize_row_qX_K: the codes again from the stored
// parameters. A sub-block with d·sc = 0 keeps the codes of its own fit, as in ggml (they all
// mean the same value then).
func (t *Type) requantize(p *Params, x []float32, codes []uint8) {
	for j := range len(x) / t.Sub {
		dl, ml := t.subBlock(p, j)
		if dl == 0 {
			continue
		}
		for i := j * t.Sub; i < (j+1)*t.Sub; i++ {
			codes[i] = t.code(x[i], dl, ml)
		}
	}
}

// blockRange returns the weights (columns) and sub-blocks of super-block b of a row of k.
func (t *Type) blockRange(k, b int) (lo, hi, sub0 int) {
	lo, hi = b*quant.SuperBlock, min((b+1)*quant.SuperBlock, k)
	return lo, hi, lo / t.Sub
}

// Get returns the parameters of super-block b of row n of the k-quant tensor q.
func (t *Type) Get(q *quant.Tensor, n, b int) Params {
	_, hi, sub0 := t.blockRange(q.K, b)
	subs, i := q.K/t.Sub, n*q.Scheme.SuperBlocks(q.K)+b
	p := Params{D: q.Scales[i]}
	copy(p.Scales[:], q.SubScales[n*subs+sub0:n*subs+hi/t.Sub])
	if t.Mins {
		p.DMin = q.Mins[i]
		copy(p.Mins[:], q.SubMins[n*subs+sub0:n*subs+hi/t.Sub])
	}
	return p
}

// Put stores p as the parameters of super-block b of row n of the k-quant tensor q.
func (t *Type) Put(q *quant.Tensor, n, b int, p *Params) {
	_, hi, sub0 := t.blockRange(q.K, b)
	subs, i := q.K/t.Sub, n*q.Scheme.SuperBlocks(q.K)+b
	q.Scales[i] = p.D
	copy(q.SubScales[n*subs+sub0:n*subs+hi/t.Sub], p.Scales[:])
	if t.Mins {
		q.Mins[i] = p.DMin
		copy(q.SubMins[n*subs+sub0:n*subs+hi/t.Sub], p.Mins[:])
	}
}

// QuantizeRow fits every super-block of row n of the k-quant tensor q (every slice allocated,
// e.g. by quant.NewKQuantTensor) from the row's K weights w and importance imp (nil, or K
// values), writing its codes and parameters. Errors name the column.
func (t *Type) QuantizeRow(q *quant.Tensor, n int, w, imp []float32) error {
	if len(w) != q.K || (imp != nil && len(imp) != q.K) {
		return fmt.Errorf("kquant: %d weights and %d importances for a row of %d", len(w), len(imp), q.K)
	}
	if i := fp.FirstNonFinite(w); i >= 0 {
		return fmt.Errorf("weight at column %d is %g", i, w[i])
	}
	codes := q.Codes[n*q.K : (n+1)*q.K]
	for b := range q.Scheme.SuperBlocks(q.K) {
		lo, hi, _ := t.blockRange(q.K, b)
		var bimp []float32
		if imp != nil {
			bimp = imp[lo:hi]
		}
		p, err := t.Fit(w[lo:hi], bimp, codes[lo:hi])
		if err != nil {
			return t.blockError(q.K, b, err)
		}
		t.Put(q, n, b, &p)
	}
	return nil
}

// blockError names the columns of super-block b of a row of k in err.
func (t *Type) blockError(k, b int, err error) error {
	lo, hi, _ := t.blockRange(k, b)
	return fmt.Errorf("columns %d…%d: %w", lo, hi-1, err)
}
