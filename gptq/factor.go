package gptq

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
	"gonum.org/v1/gonum/lapack/lapack64"
)

// The reference computes U, the upper Cholesky factor of (H + λI)⁻¹ = UᵀU, with three
// factorisations, and quantizes column i as q = quantize(w_i), e = (w_i − q)/U_ii,
// w_j −= e·U_ij for the later columns j. Its inverse T = U⁻¹ is the Cholesky factor of H itself:
// H + λI = T·Tᵀ with T upper triangular, so T = J·L·J where J reverses the columns and
// J(H + λI)J = LLᵀ. From W − Q = E·U (each column's final value is the original minus the
// errors spread into it), E = (W − Q)·T, and column j's working weight is
//
//	w_j = W_j + Σ_{i<j} (W_i − q_i)·T_ij / T_jj,
//
// with e_j = (w_j − q_j)·T_jj. So one Cholesky factorisation suffices: GPTQ spreads each
// column's difference from the original weights, d_i = W_i − q_i, with T′_ij = T_ij/T_jj,
// where the reference spreads e_i with U_ij. The inverse (as many flops as the factorisation,
// and on a GPU more time) is not computed.

// columnFactor returns T′ for (Hp + λI), Hp being h with the dead columns' diagonal set to 1,
// permuted by perm (Hp[i,j] = h[perm[i], perm[j]]): a K×K row-major float32 matrix with
// T′_ij = T_ij/T_jj above the diagonal, T_ii on it, zero below. λ = Damp·mean(diag Hp); when the
// factorisation fails the damping grows tenfold up to MaxDamp, each failure noted in st. The
// factorisation runs in float64.
func columnFactor(ws *Workspace, h []float64, k int, perm []int, dead []bool, opt Options, st *Stats) ([]float32, error) {
	meanDiag := 0.0
	for i := range k {
		meanDiag += diagFixed(h[i*k+i], dead[i])
	}
	meanDiag /= float64(k)
	ws.factor = grow(ws.factor, k*k)
	for damp := opt.Damp; ; damp *= 10 {
		lambda := damp * meanDiag
		if reversedCholesky(ws.factor, h, k, perm, dead, lambda) {
			ws.t = grow(ws.t, k*k)
			if unreverse(ws.t, ws.factor, k) {
				st.Damp, st.Lambda = damp, lambda
				return ws.t, nil
			}
		}
		st.Retries++
		st.FailedDamps = append(st.FailedDamps, damp)
		if damp*10 > opt.MaxDamp*(1+1e-9) {
			return nil, fmt.Errorf("gptq: the Hessian is not positive definite even with damping %g (λ = %g, mean diag %g); %d tries",
				damp, lambda, meanDiag, st.Retries)
		}
	}
}

// diagFixed is H_ii, or 1 for a dead column (the reference's H[dead, dead] = 1).
func diagFixed(hii float64, dead bool) float64 {
	if dead {
		return 1
	}
	return hii
}

// reversedCholesky fills the lower triangle of f with J·(Hp + λI)·J and factors it as LLᵀ (L
// in place). It reports whether the factorisation succeeded.
func reversedCholesky(f, h []float64, k int, perm []int, dead []bool, lambda float64) bool {
	for a := range k {
		src := perm[k-1-a]
		row := f[a*k : a*k+a+1]
		for b := range row {
			row[b] = h[src*k+perm[k-1-b]]
		}
		row[a] = diagFixed(h[src*k+src], dead[src]) + lambda
	}
	_, ok := lapack64.Potrf(blas64.Symmetric{Uplo: blas.Lower, N: k, Stride: k, Data: f})
	return ok
}

// unreverse writes T′ from T = J·L·J (L: lower triangle of f) into t as float32, the quotients
// taken in float64, and reports whether every entry is finite and the diagonal positive.
func unreverse(t []float32, f []float64, k int) bool {
	for i := range k {
		a := k - 1 - i
		row := t[i*k : (i+1)*k]
		clear(row[:i])
		row[i] = float32(f[a*k+a])
		for j := i + 1; j < k; j++ {
			b := k - 1 - j
			row[j] = float32(f[a*k+b] / f[b*k+b])
		}
		for _, v := range row[i:] {
			if math.IsInf(float64(v), 0) || v != v {
				return false
			}
		}
		if !(row[i] > 0) {
			return false
		}
	}
	return true
}
