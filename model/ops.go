package model

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/qpack-dev/qpack/fp"
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

// siluMul computes g[i] = silu(g[i])·u[i], the gated MLP activation.
func siluMul(g, u []float32) {
	u = u[:len(g)]
	for i, v := range g {
		g[i] = float32(float64(v)/(1+math.Exp(-float64(v)))) * u[i]
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
// previous window tokens (sliding-window attention), 0 means full causal attention.
func attention(out, q, k, v []float32, T, heads, kvHeads, headDim, window int) {
	const queryBlock = 32
	blocks := (T + queryBlock - 1) / queryBlock
	jobs := heads * blocks
	var next atomic.Int64
	work := func() {
		scores := make([]float32, T)
		for {
			j := int(next.Add(1) - 1)
			if j >= jobs {
				return
			}
			h, t0 := j/blocks, (j%blocks)*queryBlock
			for t := t0; t < min(t0+queryBlock, T); t++ {
				attendOne(out, q, k, v, scores, t, h, h/(heads/kvHeads), heads, kvHeads, headDim, window)
			}
		}
	}
	parallel(min(jobs, runtime.GOMAXPROCS(0)), work)
}

// attendOne computes the output of query position t of head h.
func attendOne(out, q, k, v, scores []float32, t, h, kh, heads, kvHeads, headDim, window int) {
	scale := float32(1 / math.Sqrt(float64(headDim)))
	qt := q[(t*heads+h)*headDim : (t*heads+h+1)*headDim]
	first := 0
	if window > 0 {
		first = max(0, t-window+1)
	}
	maxScore := float32(math.Inf(-1))
	for j := first; j <= t; j++ {
		s := dot(qt, k[(j*kvHeads+kh)*headDim:(j*kvHeads+kh+1)*headDim]) * scale
		scores[j] = s
		maxScore = max(maxScore, s)
	}
	var sum float64
	for j := first; j <= t; j++ {
		e := float32(math.Exp(float64(scores[j] - maxScore)))
		scores[j] = e
		sum += float64(e)
	}
	ot := out[(t*heads+h)*headDim : (t*heads+h+1)*headDim]
	clear(ot)
	inv := float32(1 / sum)
	for j := first; j <= t; j++ {
		p := scores[j] * inv
		vj := v[(j*kvHeads+kh)*headDim : (j*kvHeads+kh+1)*headDim][:len(ot)]
		for i := range ot {
			ot[i] += p * vj[i]
		}
	}
}
