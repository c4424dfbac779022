package gptq

import (
	"math"
	"math/rand/v2"
	"sync"
)

// The MSE clip search (blockwise's clipSearch, Options.Clip) sums |Q(w) − w|^2.4 with
// math.Pow. Its result is not correctly rounded, so the GPU reproduces it by doing what Go's
// math.Pow does on amd64, step by step: the pure-Go pow (Modf, Frexp, Ldexp and the squaring
// loop) around the assembly Log (math/log_amd64.s) and Exp (math/exp_amd64.s). Exp has two
// paths, with and without FMA instructions, chosen by the CPU the process runs on, so the
// host finds out which one its math.Exp takes (clipPowPath) and tells the kernel.
// clipPow below is that computation in Go; kernels/gptq.cu's go_pow_clip is the same in CUDA.

// clipNormInt and clipNormFrac are math.Modf(2.4): blockwise's clip norm (clipNorm) split the
// way Pow splits it.
const (
	clipNormInt  = 2
	clipNormFrac = 0x3fd9999999999998 // bits of 2.4 − 2 = 0.3999999999999999
)

// clipPow is math.Pow(d, 2.4) for d ≥ 0, NaN or +Inf, as amd64 computes it, with math.Exp's
// FMA path or its plain one.
func clipPow(d float64, fma bool) float64 {
	switch {
	case d == 1:
		return 1
	case d != d:
		return d
	case d == 0:
		return 0
	case math.IsInf(d, 1):
		return d
	}
	a1 := amd64Exp(float64(math.Float64frombits(clipNormFrac)*amd64Log(d)), fma)
	x1, xe := math.Frexp(d)
	ae := 0
	for i := clipNormInt; i != 0; i >>= 1 { // the squaring loop of pow (no exponent overflow here)
		if i&1 == 1 {
			a1 = float64(a1 * x1)
			ae += xe
		}
		x1 = float64(x1 * x1)
		xe <<= 1
		if x1 < .5 {
			x1 = float64(x1 + x1)
			xe--
		}
	}
	return math.Ldexp(a1, ae)
}

// amd64Log is math/log_amd64.s's Log: each float64() is one SSE instruction.
func amd64Log(x float64) float64 {
	const (
		hSqrt2 = 7.07106781186547524401e-01
		ln2Hi  = 6.93147180369123816490e-01
		ln2Lo  = 1.90821492927058770002e-10
		l1     = 6.666666666666735130e-01
		l2     = 3.999999999940941908e-01
		l3     = 2.857142874366239149e-01
		l4     = 2.222219843214978396e-01
		l5     = 1.818357216161805012e-01
		l6     = 1.531383769920937332e-01
		l7     = 1.479819860511658591e-01
	)
	b := math.Float64bits(x)
	switch {
	case b&^(1<<63) == 0:
		return math.Inf(-1)
	case int64(b) < 0:
		return math.Float64frombits(0x7ff8000000000001)
	case b >= 0x7ff0000000000000:
		return x
	}
	f1 := math.Float64frombits(b&0x000fffffffffffff | 0x3fe0000000000000) // Frexp without subnormals
	k := float64(int32(b>>52&0x7ff) - 0x3fe)
	var one float64
	if !(hSqrt2 < f1) { // CMPSD "not less than": also at f1 == √2/2
		one = 1
	}
	k = float64(k - one)
	f1 = float64(f1 * float64(one+1))
	f := float64(f1 - 1)
	s := float64(f / float64(2+f))
	s2 := float64(s * s)
	s4 := float64(s2 * s2)
	t1 := float64(s2 * float64(float64(float64(float64(float64(float64(l7*s4)+l5)*s4)+l3)*s4)+l1))
	t2 := float64(s4 * float64(float64(float64(float64(l6*s4)+l4)*s4)+l2))
	r := float64(t1 + t2)
	hfsq := float64(float64(0.5*f) * f)
	x3 := float64(float64(s*float64(r+hfsq)) + float64(ln2Lo*k))
	x0 := float64(float64(hfsq-x3) - f)
	return float64(float64(k*ln2Hi) - x0)
}

// amd64Exp is math/exp_amd64.s's Exp, with its FMA path (fma) or its plain one.
func amd64Exp(x float64, fma bool) float64 {
	const (
		log2e    = 1.4426950408889634073599246810018920
		ln2U     = 0.69314718055966295651160180568695068359375
		ln2L     = 0.28235290563031577122588448175013436025525412068e-12
		overflow = 7.09782712893384e+02
		c2       = 1.6666666666666666667e-1
		c3       = 4.1666666666666666667e-2
		c4       = 8.3333333333333333333e-3
		c5       = 1.3888888888888888889e-3
		c6       = 1.9841269841269841270e-4
		c7       = 2.4801587301587301587e-5
	)
	b := math.Float64bits(x)
	if b&^(1<<63) >= 0x7ff0000000000000 {
		if b == 0xfff0000000000000 {
			return 0
		}
		return x // NaN or +Inf
	}
	if x > overflow {
		return math.Inf(1)
	}
	bx := cvtsd2sl(float64(log2e * x))
	k := float64(bx)
	coef := [...]float64{c6, c5, c4, c3, c2, 0.5, 1}
	var p float64
	if fma {
		x = math.FMA(-k, ln2U, x)
		x = math.FMA(-k, ln2L, x)
		x = float64(x * 0.0625)
		p = c7
		for _, c := range coef {
			p = math.FMA(p, x, c)
		}
		x = float64(x * p)
		for range 3 {
			x = float64(x * float64(x+2))
		}
		x = math.FMA(float64(x+2), x, 1)
	} else {
		x = float64(x - float64(ln2U*k))
		x = float64(x - float64(ln2L*k))
		x = float64(x * 0.0625)
		p = c7
		for _, c := range coef {
			p = float64(float64(p*x) + c)
		}
		x = float64(x * p)
		for range 4 {
			x = float64(x * float64(x+2))
		}
		x = float64(x + 1)
	}
	// fr·2^bx, as the assembly builds it.
	bx += 0x3ff
	switch {
	case bx >= 0x7ff:
		return math.Inf(1)
	case bx > 0:
		return float64(x * math.Float64frombits(uint64(bx)<<52))
	case bx < -52:
		return 0
	}
	x = float64(x * math.Float64frombits(uint64(bx+0x3fe)<<52))
	return float64(x * math.Float64frombits(1<<52))
}

// cvtsd2sl is CVTSD2SL: x rounded to the nearest int32 (ties to even), or math.MinInt32 when
// out of range or NaN.
func cvtsd2sl(x float64) int32 {
	r := math.RoundToEven(x)
	if !(r >= math.MinInt32 && r <= math.MaxInt32) {
		return math.MinInt32
	}
	return int32(r)
}

// clipPowPath reports which of math.Exp's paths this process takes (fma), judged by
// math.Pow(d, 2.4) itself on inputs where the two paths differ; ok is false when math.Pow
// matches neither (not amd64): the GPU cannot reproduce the CPU's clip search there.
var clipPowPath = sync.OnceValues(func() (fma, ok bool) {
	r := rand.New(rand.NewPCG(2, 4))
	fmaOK, plainOK, told := true, true, 0
	for range 4096 {
		d := float64(float32(math.Ldexp(r.Float64()+0.5, -r.IntN(40))))
		a, b, want := clipPow(d, true), clipPow(d, false), math.Pow(d, 2.4)
		fmaOK = fmaOK && a == want
		plainOK = plainOK && b == want
		if a != b {
			told++
		}
	}
	if told == 0 || fmaOK == plainOK {
		return false, false
	}
	return fmaOK, true
})
