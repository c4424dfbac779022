package gptq

import (
	"crypto/sha256"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/quant"
)

// slowGPTQ is an independent, unblocked float64 GPTQ, column by column as in the paper: with
// the full inverse H⁻¹ of the remaining columns, quantize column i, spread
// δ = (w − q)/[H⁻¹]_ii · [H⁻¹]_{i,·} over the later columns, then eliminate column i from H⁻¹.
// It keeps the reference's conventions: dead columns, per-channel parameters from the original
// rows, static groups from the zeroed originals, act-order by decreasing diag H, and groups
// fitted from the weights as they were when the reference's 128-column block began.
//
// When follow (codes in original order, from the implementation under test) is given, a weight
// whose scaled value lies within tieTol of a rounding boundary takes follow's code if that is the
// neighbouring code: float32 and float64 may round such near-ties apart, and without this one
// tie would change every later weight of its row. Each such weight is counted in ties.
// It returns the codes and values in original column order.
func slowGPTQ(w []float32, n, k int, h []float64, s quant.Scheme, opt Options, follow []uint8) (codes []uint8, q []float32, ties int) {
	const block = 128
	gs := s.GroupSize
	if gs == quant.PerChannel {
		gs = k
	}
	hh := slices.Clone(h)
	dead := make([]bool, k)
	for i := range k {
		if hh[i*k+i] == 0 {
			dead[i], hh[i*k+i] = true, 1
		}
	}
	wz := slices.Clone(w)
	for r := range n {
		for c := range k {
			if dead[c] {
				wz[r*k+c] = 0
			}
		}
	}
	perm := make([]int, k)
	for i := range perm {
		perm[i] = i
	}
	if opt.ActOrder {
		slices.SortStableFunc(perm, func(a, b int) int {
			if hh[a*k+a] > hh[b*k+b] {
				return -1
			} else if hh[a*k+a] < hh[b*k+b] {
				return 1
			}
			return 0
		})
	}
	fit := func(x []float32) (float32, uint8) {
		return blockwise.GroupParams(s, x, nil, blockwise.Options{Clip: opt.Clip}, make([]uint8, len(x)))
	}
	// H⁻¹ of the damped, permuted Hessian by Gauss-Jordan elimination.
	mean := 0.0
	for i := range k {
		mean += hh[i*k+i]
	}
	damp := opt.Damp
	if damp == 0 {
		damp = DefaultDamp
	}
	a := make([]float64, k*k)
	for i := range k {
		for j := range k {
			a[i*k+j] = hh[perm[i]*k+perm[j]]
		}
		a[i*k+i] += damp * mean / float64(k)
	}
	rows := eliminatedRows(a, k)

	codes = make([]uint8, n*k)
	q = make([]float32, n*k)
	wp := make([]float64, n*k) // working weights, permuted columns
	for r := range n {
		for i, c := range perm {
			wp[r*k+i] = float64(wz[r*k+c])
		}
	}
	scale, zero := make([]float32, n), make([]uint8, n)
	if s.GroupSize == quant.PerChannel {
		for r := range n {
			scale[r], zero[r] = fit(w[r*k : (r+1)*k])
		}
	}
	snapshot := make([]float32, n*k)
	for i := range k {
		if i%block == 0 {
			for j, v := range wp {
				snapshot[j] = float32(v)
			}
		}
		hrow := rows[i*k : (i+1)*k] // H⁻¹'s row i once columns 0 … i−1 are eliminated
		d := hrow[i]
		for r := range n {
			row := wp[r*k : (r+1)*k]
			switch {
			case s.GroupSize == quant.PerChannel:
			case opt.StaticGroups:
				g := perm[i] / gs
				scale[r], zero[r] = fit(wz[r*k+g*gs : r*k+min((g+1)*gs, k)])
			case i%gs == 0:
				scale[r], zero[r] = fit(snapshot[r*k+i : r*k+min(i+gs, k)])
			}
			code := roundRef(s, row[i], scale[r], zero[r])
			if follow != nil && follow[r*k+perm[i]] != code && nearTie(s, row[i], scale[r], zero[r], code, follow[r*k+perm[i]]) {
				code = follow[r*k+perm[i]]
				ties++
			}
			qi := valueRef(s, code, scale[r], zero[r])
			c := r*k + perm[i]
			codes[c], q[c] = code, float32(qi)
			e := (row[i] - qi) / d
			for j := i + 1; j < k; j++ {
				row[j] -= e * hrow[j]
			}
		}
	}
	return codes, q, ties
}

// eliminated caches eliminatedRows by the matrix it was given: the variants of a test share a
// few Hessians, and the O(k³) inversion and elimination dominate the reference's time.
var eliminated = struct {
	sync.Mutex
	rows map[[32]byte][]float64
}{rows: map[[32]byte][]float64{}}

// eliminatedRows returns, for the damped Hessian a (k×k, overwritten), row i of H⁻¹ as the
// column loop reaches column i: H⁻¹ by Gauss-Jordan elimination, then column after column
// eliminated from it (the weights do not enter, so every weight matrix sees the same rows).
func eliminatedRows(a []float64, k int) []float64 {
	key := sha256.Sum256(unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), 8*len(a)))
	eliminated.Lock()
	defer eliminated.Unlock()
	if rows, ok := eliminated.rows[key]; ok {
		return rows
	}
	hinv := invert(a, k)
	rows := make([]float64, k*k)
	for i := range k {
		copy(rows[i*k+i:(i+1)*k], hinv[i*k+i:(i+1)*k])
		d := hinv[i*k+i]
		for x := i + 1; x < k; x++ { // eliminate column i from the inverse
			f := hinv[x*k+i] / d
			for j := i + 1; j < k; j++ {
				hinv[x*k+j] -= f * hinv[i*k+j]
			}
		}
	}
	eliminated.rows[key] = rows
	return rows
}

// tieTol is how close, in units of the scale, a weight must be to the midpoint between two codes
// for float rounding to decide between them: float32 working weights drift from the float64
// reference's by up to about half a percent of a scale after a thousand columns of error
// feedback (0.4% measured at 128×1000, int4-g32-asym, the reference's own seed).
const tieTol = 1e-2

// roundRef and valueRef are the grid's round-to-nearest and dequantization of one weight.
func roundRef(s quant.Scheme, x float64, scale float32, zero uint8) uint8 {
	if s.Grid == quant.NF4 {
		return quant.NF4Code(float32(x) / scale)
	}
	return s.QuantizeInt(float32(x), scale, zero)
}

func valueRef(s quant.Scheme, code uint8, scale float32, zero uint8) float64 {
	if s.Grid == quant.NF4 {
		return float64(quant.DequantizeNF4(code, scale))
	}
	return float64(quant.DequantizeInt(code, scale, zero))
}

// nearTie reports whether codes a and b are neighbours and x lies within tieTol·scale of the
// midpoint between their values.
func nearTie(s quant.Scheme, x float64, scale float32, zero, a, b uint8) bool {
	if int(a)-int(b) != 1 && int(b)-int(a) != 1 {
		return false
	}
	mid := (valueRef(s, a, scale, zero) + valueRef(s, b, scale, zero)) / 2
	return math.Abs(x-mid) < tieTol*float64(scale)
}

// invert returns a⁻¹ by Gauss-Jordan elimination with partial pivoting (a is overwritten).
func invert(a []float64, k int) []float64 {
	inv := make([]float64, k*k)
	for i := range k {
		inv[i*k+i] = 1
	}
	for c := range k {
		p := c
		for r := c + 1; r < k; r++ {
			if abs(a[r*k+c]) > abs(a[p*k+c]) {
				p = r
			}
		}
		for j := range k {
			a[c*k+j], a[p*k+j] = a[p*k+j], a[c*k+j]
			inv[c*k+j], inv[p*k+j] = inv[p*k+j], inv[c*k+j]
		}
		d := a[c*k+c]
		for j := range k {
			a[c*k+j] /= d
			inv[c*k+j] /= d
		}
		for r := range k {
			if r == c || a[r*k+c] == 0 {
				continue
			}
			f := a[r*k+c]
			for j := range k {
				a[r*k+j] -= f * a[c*k+j]
				inv[r*k+j] -= f * inv[c*k+j]
			}
		}
	}
	return inv
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
