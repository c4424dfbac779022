package gptq

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/quant"
)

var shapes = [][2]int{{96, 200}, {256, 384}, {128, 1000}}

// TestBeatsRTN: on the same weights and Hessian, GPTQ's proxy loss is at most RTN's, for every
// scheme and option; the tensor is valid and Stats.Loss is the directly computed proxy loss.
func TestBeatsRTN(t *testing.T) {
	for si, shape := range shapes {
		n, k := shape[0], shape[1]
		if k > 500 && testing.Short() {
			continue
		}
		r := rand.New(rand.NewPCG(uint64(si), 7))
		w, h := randomWeights(r, n, k), testHessian(t, r, k)
		for _, v := range variants() {
			t.Run(fmt.Sprintf("%dx%d/%s", n, k, v.name), func(t *testing.T) {
				gt, st, err := Quantize(w, n, k, h, v.s, v.opt)
				if err != nil {
					t.Fatal(err)
				}
				if err := gt.Validate(); err != nil {
					t.Fatal(err)
				}
				rt, err := blockwise.Quantize(w, n, k, v.s, blockwise.Options{Clip: v.opt.Clip})
				if err != nil {
					t.Fatal(err)
				}
				gLoss := proxyLoss(w, gt.Dequantize(nil), n, k, h)
				rLoss := proxyLoss(w, rt.Dequantize(nil), n, k, h)
				if gLoss > rLoss {
					t.Errorf("GPTQ proxy loss %g > RTN %g", gLoss, rLoss)
				}
				if d := relDiff(st.Loss, gLoss); d > 1e-3 {
					t.Errorf("Stats.Loss %g, direct tr(ΔW H ΔWᵀ) %g (rel. diff %g)", st.Loss, gLoss, d)
				}
				t.Logf("GPTQ/RTN proxy loss %.3f", gLoss/rLoss)
			})
		}
	}
}

// TestMatchesSlowReference compares the blocked float32 implementation with the unblocked
// float64 one of the test: the same codes but for rare rounding ties, and proxy losses within
// 1e-4 relative.
func TestMatchesSlowReference(t *testing.T) {
	mismatched, tied, total := 0, 0, 0
	for si, shape := range shapes {
		n, k := shape[0], shape[1]
		r := rand.New(rand.NewPCG(uint64(si), 11))
		w, h := randomWeights(r, n, k), testHessian(t, r, k)
		for _, v := range variants() {
			if v.s.Bits == 3 && !v.opt.Clip || v.s.Bits == 8 && v.s.GroupSize == 32 || k > 500 && v.s.Bits != 4 {
				continue // keep the test quick; the other bit widths cover the same code paths
			}
			if k > 500 && testing.Short() {
				continue
			}
			t.Run(fmt.Sprintf("%dx%d/%s", n, k, v.name), func(t *testing.T) {
				gt, _, err := Quantize(w, n, k, h, v.s, v.opt)
				if err != nil {
					t.Fatal(err)
				}
				codes, q, ties := slowGPTQ(w, n, k, h, v.s, v.opt, gt.Codes)
				diff := 0
				for i, c := range codes {
					if gt.Codes[i] != c {
						diff++
					}
				}
				mismatched += diff
				tied += ties
				total += len(codes)
				if diff > 0 || float64(ties) > 1e-3*float64(len(codes)) {
					t.Errorf("%d of %d codes differ from the slow reference, %d rounding ties", diff, len(codes), ties)
				}
				fast, slow := proxyLoss(w, gt.Dequantize(nil), n, k, h), proxyLoss(w, q, n, k, h)
				if d := relDiff(fast, slow); d > 1e-4 {
					t.Errorf("proxy loss %g, slow reference %g (rel. diff %g)", fast, slow, d)
				}
			})
		}
	}
	t.Logf("%d of %d codes differ from the slow reference, %d were rounding ties", mismatched, total, tied)
}

// TestActOrderGIdx: under act-order with groups fitted on the fly, g_idx[c] is the position of c
// in the order of decreasing diag H divided by the group size, and Dequantize (which uses g_idx)
// gives the slow reference's Q wherever the codes agree.
func TestActOrderGIdx(t *testing.T) {
	n, k := 64, 320
	r := rand.New(rand.NewPCG(3, 3))
	w, h := randomWeights(r, n, k), testHessian(t, r, k)
	s := quant.Scheme{Bits: 4, GroupSize: 32, Sym: true}
	gt, _, err := Quantize(w, n, k, h, s, Options{ActOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	if gt.GIdx == nil {
		t.Fatal("act-order tensor has no g_idx")
	}
	perm := columnOrder(diagonal(h, k), make([]bool, k), true)
	for i := 1; i < k; i++ {
		if h[perm[i-1]*k+perm[i-1]] < h[perm[i]*k+perm[i]] {
			t.Fatalf("order not by decreasing diag H at position %d", i)
		}
	}
	for i, c := range perm {
		if int(gt.GIdx[c]) != i/s.GroupSize {
			t.Fatalf("g_idx[%d] = %d; column is at position %d, want group %d", c, gt.GIdx[c], i, i/s.GroupSize)
		}
	}
	codes, q, _ := slowGPTQ(w, n, k, h, s, Options{ActOrder: true}, nil)
	deq := gt.Dequantize(nil)
	agree := 0
	for i := range codes {
		if codes[i] == gt.Codes[i] {
			agree++
			if deq[i] != q[i] {
				t.Fatalf("weight %d: Dequantize %g, algorithm's Q %g", i, deq[i], q[i])
			}
		}
	}
	if agree < len(codes)*999/1000 {
		t.Fatalf("only %d of %d codes agree", agree, len(codes))
	}
	st, _, err := Quantize(w, n, k, h, s, Options{ActOrder: true, StaticGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.GIdx != nil {
		t.Fatal("static groups with act-order must keep the trivial g_idx (nil)")
	}
}
