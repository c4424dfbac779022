package gptq

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
	"gonum.org/v1/gonum/lapack/lapack64"
)

// inverseFactor returns U, the upper Cholesky factor of (Hp + λI)⁻¹ = UᵀU as a K×K row-major
// float32 matrix (upper triangle; the rest is zero), where Hp is h with the dead columns' diagonal
// set to 1, permuted by perm (Hp[i,j] = h[perm[i], perm[j]]). λ = Damp·mean(diag Hp); when the
// factorisation fails the damping grows tenfold up to MaxDamp, each failure noted in st.
//
// The reference factors three times (cholesky, cholesky_inverse, cholesky upper). One factor
// and one triangular inverse give the same U: with J the reversal permutation and
// JHJ = LLᵀ, H⁻¹ = J L⁻ᵀ L⁻¹ J = (J L⁻¹ J)ᵀ (J L⁻¹ J), and J L⁻¹ J is upper triangular with a
// positive diagonal, so it is U. Both steps run in float64.
func inverseFactor(ws *Workspace, h []float64, k int, perm []int, dead []bool, opt Options, st *Stats) ([]float32, error) {
	meanDiag := 0.0
	for i := range k {
		meanDiag += diagFixed(h[i*k+i], dead[i])
	}
	meanDiag /= float64(k)
	ws.factor = grow(ws.factor, k*k)
	for damp := opt.Damp; ; damp *= 10 {
		lambda := damp * meanDiag
		if reversedInverseCholesky(ws.factor, h, k, perm, dead, lambda) {
			ws.u = grow(ws.u, k*k)
			if unreverse(ws.u, ws.factor, k) {
				st.Damp, st.Lambda = damp, lambda
				return ws.u, nil
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

// reversedInverseCholesky fills the lower triangle of f with J·(Hp + λI)·J, factors it as LLᵀ
// and overwrites L with L⁻¹. It reports whether both steps succeeded.
func reversedInverseCholesky(f, h []float64, k int, perm []int, dead []bool, lambda float64) bool {
	for a := range k {
		src := perm[k-1-a]
		row := f[a*k : a*k+a+1]
		for b := range row {
			row[b] = h[src*k+perm[k-1-b]]
		}
		row[a] = diagFixed(h[src*k+src], dead[src]) + lambda
	}
	if _, ok := lapack64.Potrf(blas64.Symmetric{Uplo: blas.Lower, N: k, Stride: k, Data: f}); !ok {
		return false
	}
	return lapack64.Trtri(blas64.Triangular{Uplo: blas.Lower, Diag: blas.NonUnit, N: k, Stride: k, Data: f})
}

// unreverse writes U = J·Linv·J (Linv: lower triangle of f) into u as float32, zero below the
// diagonal, and reports whether every entry is finite and the diagonal positive.
func unreverse(u []float32, f []float64, k int) bool {
	for i := range k {
		a := k - 1 - i
		row := u[i*k : (i+1)*k]
		clear(row[:i])
		for j := i; j < k; j++ {
			row[j] = float32(f[a*k+k-1-j])
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
