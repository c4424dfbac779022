package model

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/qpack-dev/qpack/blas"
	"github.com/qpack-dev/qpack/fp"
	"github.com/qpack-dev/qpack/vec"
)

// rmsNorm writes dst[r] = x[r]·rsqrt(mean(x[r]²)+eps)·weight for each of rows rows of dim
// values, rounding like transformers' float32 RMSNorm (the mean is summed in float64).
// dst may be x.
func rmsNorm(dst, x, weight []float32, rows, dim int, eps float64) {
	weight = weight[:dim]
	for r := range rows {
		xr, dr := x[r*dim:(r+1)*dim], dst[r*dim:(r+1)*dim]
		var ss float64
		for _, v := range xr {
			ss += float64(v) * float64(v)
		}
		variance := float32(ss/float64(dim)) + float32(eps)
		scale := float32(1 / math.Sqrt(float64(variance)))
		for i, v := range xr {
			dr[i] = weight[i] * (v * scale)
		}
	}
}

// siluMul computes g[i] = silu(g[i])·u[i] = g[i]/(1 + e^−g[i])·u[i], the gated MLP activation.
func siluMul(g, u []float32) {
	u = u[:len(g)]
	var e [1024]float32
	for i0 := 0; i0 < len(g); i0 += len(e) {
		gs := g[i0:min(i0+len(e), len(g))]
		es := e[:len(gs)]
		for i, v := range gs {
			es[i] = -v
		}
		vec.Exp(es, es)
		us := u[i0:][:len(gs)]
		for i, v := range gs {
			gs[i] = v / (1 + es[i]) * us[i]
		}
	}
}

// ropeTable holds the rotary frequencies and the cos/sin of every position computed so far.
type ropeTable struct {
	invFreq  []float32 // [HeadDim/2]
	mu       sync.Mutex
	cos, sin []float32 // [positions, HeadDim/2]
}

// newRopeTable computes inv_freq as transformers does, in float32:
// 1 / theta^(2i/dim), then the "linear" or "llama3" adjustment.
func newRopeTable(cfg *Config) *ropeTable {
	half := cfg.HeadDim / 2
	inv := make([]float32, half)
	for i := range inv {
		e := float32(2*i) / float32(cfg.HeadDim)
		inv[i] = float32(1 / float64(float32(math.Pow(cfg.Rope.Theta, float64(e)))))
	}
	switch cfg.Rope.Type {
	case "linear":
		for i := range inv {
			inv[i] /= float32(cfg.Rope.Factor)
		}
	case "llama3":
		llama3Frequencies(inv, cfg.Rope)
	}
	if cfg.Rope.InvFreqBF16 {
		for i := range inv {
			inv[i] = fp.BF16ToF32(fp.F32ToBF16(inv[i]))
		}
	}
	return &ropeTable{invFreq: inv}
}

// llama3Frequencies applies Llama 3.1's band-wise scaling (transformers _compute_llama3_parameters):
// long wavelengths are divided by factor, short ones kept, the band between interpolated.
func llama3Frequencies(inv []float32, r Rope) {
	factor, low, high := float32(r.Factor), float32(r.LowFreqFactor), float32(r.HighFreqFactor)
	old := float32(r.OriginalMaxPositions)
	lowWavelen, highWavelen := old/low, old/high
	for i, f := range inv {
		wavelen := float32(2*math.Pi) / f
		scaled := f
		if wavelen > lowWavelen {
			scaled = f / factor
		}
		if !(wavelen < highWavelen) && !(wavelen > lowWavelen) {
			smooth := (old/wavelen - low) / (high - low)
			scaled = (1-smooth)*scaled/factor + smooth*scaled
		}
		inv[i] = scaled
	}
}

// get returns cos and sin [T, HeadDim/2] for positions 0..T-1.
func (r *ropeTable) get(T int) (cos, sin []float32) {
	half := len(r.invFreq)
	r.mu.Lock()
	defer r.mu.Unlock()
	if have := len(r.cos) / half; have < T {
		cos, sin := make([]float32, T*half), make([]float32, T*half)
		copy(cos, r.cos)
		copy(sin, r.sin)
		for t := have; t < T; t++ {
			for i, f := range r.invFreq {
				angle := float64(float32(t) * f) // the float32 outer product transformers forms
				cos[t*half+i] = float32(math.Cos(angle))
				sin[t*half+i] = float32(math.Sin(angle))
			}
		}
		r.cos, r.sin = cos, sin
	}
	return r.cos[:T*half], r.sin[:T*half]
}

// applyRope rotates x [T, heads, headDim] in place with transformers' rotate_half layout:
// the pairs are (i, i+headDim/2).
func applyRope(x, cos, sin []float32, T, heads, headDim int) {
	half := headDim / 2
	for t := range T {
		c, s := cos[t*half:(t+1)*half], sin[t*half:(t+1)*half]
		for h := range heads {
			lo := x[(t*heads+h)*headDim : (t*heads+h)*headDim+half]
			hi := x[(t*heads+h)*headDim+half : (t*heads+h+1)*headDim][:len(lo)]
			for i := range lo {
				a, b := lo[i], hi[i]
				lo[i] = a*c[i] - b*s[i]
				hi[i] = b*c[i] + a*s[i]
			}
		}
	}
}

// attention computes causal softmax(q·kᵀ/√d)·v per head into out [T, heads·headDim], each query
// head reading key/value head h/(heads/kvHeads) (GQA). window > 0 limits each query to the
// previous window tokens (sliding-window attention), 0 means full causal attention. Each head's
// queries go in blocks: the block's scores against every key it may see are one product, the
// softmax runs over each row's keys, and the output is a second product with the values.
func attention(out, q, k, v []float32, T, heads, kvHeads, headDim, window int) {
	const queryBlock = 64
	blocks := (T + queryBlock - 1) / queryBlock
	jobs := heads * blocks
	var next atomic.Int64
	work := func() {
		scores := make([]float32, queryBlock*T)
		for {
			j := int(next.Add(1) - 1)
			if j >= jobs {
				return
			}
			h, t0 := j/blocks, (j%blocks)*queryBlock
			attendBlock(out, q, k, v, scores, t0, min(t0+queryBlock, T), h, h/(heads/kvHeads), heads, kvHeads, headDim, window)
		}
	}
	parallel(min(jobs, runtime.GOMAXPROCS(0)), work)
}

// attendBlock computes the outputs of query positions [t0, t1) of head h (key/value head kh);
// scores is scratch of at least (t1−t0)·t1 values.
func attendBlock(out, q, k, v, scores []float32, t0, t1, h, kh, heads, kvHeads, headDim, window int) {
	first := 0 // the first key any query of the block sees
	if window > 0 {
		first = max(0, t0-window+1)
	}
	rows, keys := t1-t0, t1-first
	scale := float32(1 / math.Sqrt(float64(headDim)))
	s := scores[:rows*keys]
	blas.SgemmSerial(blas.NoTrans, blas.Trans, rows, keys, headDim, scale, q[(t0*heads+h)*headDim:], heads*headDim,
		k[(first*kvHeads+kh)*headDim:], kvHeads*headDim, 0, s, keys)
	for r := range rows {
		t := t0 + r
		lo := first
		if window > 0 {
			lo = max(0, t-window+1)
		}
		row := s[r*keys : (r+1)*keys]
		clear(row[:lo-first])
		softmax(row[lo-first : t-first+1])
		clear(row[t-first+1:])
	}
	blas.SgemmSerial(blas.NoTrans, blas.NoTrans, rows, headDim, keys, 1, s, keys, v[(first*kvHeads+kh)*headDim:], kvHeads*headDim,
		0, out[(t0*heads+h)*headDim:], heads*headDim)
}

// softmax replaces x by exp(x − max x) / Σ exp(x − max x), the sum in float64.
func softmax(x []float32) {
	sum := vec.ExpSum(x, x, vec.Max(x))
	vec.Scale(x, float32(1/sum))
}
