// Package gptq quantizes a linear layer's weights with GPTQ (Frantar et al., 2022), following
// the reference implementation (IST-DASLab/gptq, fasterquant) and its AutoGPTQ options.
//
// Collect the Hessian of the layer's inputs, then quantize:
//
//	h := gptq.NewHessian(k)
//	for each calibration batch x[rows, k]: h.Add(x, rows, k)   // H = 2/n Σ xᵀx, float64
//	t, stats, err := gptq.Quantize(w, n, k, h.Matrix(), quant.Scheme{Bits: 4, GroupSize: 128, Sym: true},
//		gptq.Options{ActOrder: true})
//
// Hessians collected in parallel combine with Merge. Quantize returns a quant.Tensor (codes in
// the original column order, F16-exact scales, integer zeros, GIdx under act-order) and Stats:
// the proxy loss tr(ΔW H ΔWᵀ), the damping used and the failed tries, timings.
//
// The algorithm, as in the reference:
//
//  1. Dead columns (H_ii = 0) get H_ii = 1 and zero weights.
//  2. Per-channel parameters come from the whole row; static groups (Options.StaticGroups)
//     from the original weights, in the original column order.
//  3. Act-order (Options.ActOrder) quantizes columns by decreasing diag H.
//  4. λ = Damp·mean(diag H) is added to the diagonal. The reference's U, the upper Cholesky
//     factor of H⁻¹, is the inverse of T, the upper triangular factor of H = T·Tᵀ, which one
//     Cholesky factorisation gives (of H with its columns reversed, in float64, gonum's LAPACK);
//     no inverse is computed (factor.go). A failed factorisation is retried with ten times the
//     damping, up to MaxDamp.
//  5. Columns are quantized in blocks of 128, each row on its own (rows share only T): q =
//     quantize(w), d = W − q against the original weight W, the rest of the block += d·T_ij/T_jj
//     (float32); after the block, all later columns += D·T′[block, later] (a float32 GEMM). Each
//     column is quantized from the same value as in the reference (which spreads
//     e = (w − q)/U_ii with U), and the loss is Σ e² with e = (w − q)·T_ii.
//     Groups fitted on the fly read the weights as they were before the current block's own
//     updates, which is what the reference's find_params(W[:, i:i+gs]) sees: those partial sums
//     differ between the two forms, and are recovered by a triangular solve with the block's
//     diagonal block of T (problem.settled).
//
// Every integer scheme of package quant (2, 3, 4, 8 bits; per-channel or groups; symmetric
// or not) is supported, with min-max parameters or the reference's MSE clipping search
// (Options.Clip, shared with blockwise), and so are NF4 groups (nearest NF4 value) and the
// k-quants q2_k … q6_k: each super-block of 256 columns is a group, fitted by ggml's algorithm
// (package kquant; with Options.Imatrix its imatrix variant, importance diag H) when the column
// loop reaches it, or before any update with static groups; every weight is then coded with
// those fixed parameters. K-quants have no g_idx, so act-order needs static groups with them.
//
// llama.cpp's IQ types (package iquant) likewise fit each block (256 columns, 32 for iq4_nl) by
// ggml's algorithm when the loop reaches it, always with its importance variant (importance
// diag H, with or without Options.Imatrix). Their lattice types code
// 8 weights jointly (a grid point and a sign byte; two points for IQ3), so each group of 8 is
// coded when the loop reaches its first column, from its weights at that moment, by an
// exhaustive search of the grid at the block's fixed scales weighted by GPTQ's costs 1/U_jj² = T_jj²;
// every column's error is then spread as usual (the errors of a group's later columns include
// the updates from its earlier ones, which makes the sequence exactly the block update for the
// whole group). They refuse act-order. Other grids are refused.
//
// The FP4 grids NVFP4 and MXFP4 are fitted block by block like groups (their E4M3 or E8M0
// block scale; NVFP4's global scale is fixed beforehand, from W or Options.GlobalScale), each
// weight coded to the nearest E2M1 value; they have no g_idx either. Unlike the reference's
// groups, a block on the fly is fitted when the loop reaches its first column, from the weights
// at that moment, and its scale is always searched among the representable ones, weighted by
// diag H (blockwise's imatrix search, with or without Options.Imatrix). Other grids are refused.
package gptq
