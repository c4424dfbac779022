package quant

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
)

// Dequantize writes the N×K float32 weights that t stands for into dst (row-major) and returns
// it; dst is grown when its capacity is below N×K. Per grid, with g the group of column k
// (GIdx when set):
//
//	Integer: scale·(q − zero)
//	NF4:     scale·NF4Values[q]
//	FP8:     scale·e4m3(q)
//	Binary:  offset + scale·(2q − 1)   (offset 0 when Offsets is empty)
//	KQuant:  (d·sc)·q − dmin·m or (d·sc)·(q − o), see kquant.go
//	IQuant:  a grid point's coordinate or a 4-bit code's value times the sub-block's factor, see iquant.go
//	NVFP4:   e2m1(q)·(scale/GlobalScale)        MXFP4: e2m1(q)·scale
//	FP8Block: scale·e4m3(q), the scale of the q's B×B block
//
// t must be valid (see Validate); inconsistent lengths panic.
func (t *Tensor) Dequantize(dst []float32) []float32 {
	if cap(dst) < t.N*t.K {
		dst = make([]float32, t.N*t.K)
	}
	dst = dst[:t.N*t.K]
	// Large tensors are split by rows over the cores: a 7B MLP weight is 45M values, which one
	// core dequantizes in about 0.15 s — a third of GPTQ's own GPU time on that layer.
	const perWorker = 1 << 20
	workers := min(runtime.GOMAXPROCS(0), max(1, t.N*t.K/perWorker), t.N)
	rows := (t.N + workers - 1) / workers
	var wg sync.WaitGroup
	for r0 := 0; r0 < t.N; r0 += rows {
		r1 := min(r0+rows, t.N)
		wg.Go(func() { t.DequantizeRows(dst[r0*t.K:r1*t.K], r0, r1) })
	}
	wg.Wait()
	return dst
}

// DequantizeRows writes rows r0…r1−1 of the weights (see Dequantize) into dst[:(r1−r0)·K], so
// that a caller can stream a large tensor through a small buffer, e.g. to measure its error.
// Without act-order, each group's parameters are looked up once per group, not per weight.
func (t *Tensor) DequantizeRows(dst []float32, r0, r1 int) {
	if t.Scheme.Grid == KQuant {
		for n := r0; n < r1; n++ {
			t.dequantizeKRow(dst[(n-r0)*t.K:(n-r0+1)*t.K], n)
		}
		return
	}
	if t.Scheme.Grid == IQuant {
		for n := r0; n < r1; n++ {
			t.dequantizeIQRow(dst[(n-r0)*t.K:(n-r0+1)*t.K], n)
		}
		return
	}
	groups := t.Scheme.Groups(t.K)
	gs := t.K
	if groups > 1 {
		gs = t.Scheme.GroupSize
	}
	for n := r0; n < r1; n++ {
		codes := t.Codes[n*t.K : (n+1)*t.K]
		out := dst[(n-r0)*t.K : (n-r0+1)*t.K]
		if t.GIdx != nil {
			for k, q := range codes {
				out[k] = t.dequantizeOne(q, n*groups+int(t.GIdx[k]))
			}
			continue
		}
		for g := range groups {
			lo, hi := g*gs, min((g+1)*gs, t.K)
			t.dequantizeGroup(out[lo:hi], codes[lo:hi], n*groups+g)
		}
	}
}

// dequantizeGroup writes the values of codes, all in group i, to out.
func (t *Tensor) dequantizeGroup(out []float32, codes []uint8, i int) {
	out = out[:len(codes)]
	if t.Scheme.IsFP4() {
		f := t.FP4Factor(t.Scales[i])
		for k, q := range codes {
			out[k] = FP4Values[q&15] * f
		}
		return
	}
	if t.Scheme.Grid != Integer {
		for k, q := range codes {
			out[k] = t.dequantizeOne(q, i)
		}
		return
	}
	scale, zero := t.Scales[i], t.Zeros[i]
	for k, q := range codes {
		out[k] = DequantizeInt(q, scale, zero)
	}
}

// dequantizeOne returns the value of code q in group i (row-major over N × groups).
func (t *Tensor) dequantizeOne(q uint8, i int) float32 {
	scale := t.Scales[i]
	switch t.Scheme.Grid {
	case Integer:
		return DequantizeInt(q, scale, t.Zeros[i])
	case NF4:
		return DequantizeNF4(q, scale)
	case FP8E4M3, FP8Block:
		return DequantizeFP8(q, scale)
	case NVFP4, MXFP4:
		return FP4Values[q&15] * t.FP4Factor(scale)
	case Binary:
		var offset float32
		if len(t.Offsets) > 0 {
			offset = t.Offsets[i]
		}
		return DequantizeBinary(q, scale, offset)
	}
	panic(fmt.Sprintf("quant: dequantize: unknown grid %d", int(t.Scheme.Grid)))
}

// Validate checks that t is consistent: a valid scheme, positive N and K, slice lengths that
// match N, K and the scheme's group count, codes below 2^bits (and no FP8 NaN codes), finite
// non-zero scales, integer zero points ≤ maxq (exactly 2^(bits−1) when symmetric), finite
// binary offsets, and GIdx values inside [0, groups). K-quants: see validateKQuant; IQ types:
// validateIQuant; the microscaled grids: validateMicroscaled.
func (t *Tensor) Validate() error {
	s := t.Scheme
	if err := s.Validate(); err != nil {
		return err
	}
	if t.N <= 0 || t.K <= 0 {
		return fmt.Errorf("quantized tensor %dx%d: dimensions must be positive", t.N, t.K)
	}
	if t.GlobalScale != 0 && s.Grid != NVFP4 {
		return fmt.Errorf("%s: only NVFP4 tensors have a global scale", s)
	}
	if s.Grid == KQuant {
		if len(t.Points)+len(t.Signs) > 0 {
			return fmt.Errorf("%s: grid points and signs belong to IQ types only", s)
		}
		return t.validateKQuant()
	}
	if s.Grid == IQuant {
		return t.validateIQuant()
	}
	if s.Grid.IsMicroscaled() {
		return t.validateMicroscaled()
	}
	if len(t.Mins)+len(t.SubScales)+len(t.SubMins)+len(t.Points)+len(t.Signs) > 0 {
		return fmt.Errorf("%s: mins, sub-block scales, grid points and signs belong to k-quants and IQ types only", s)
	}
	groups := s.Groups(t.K)
	ng := t.N * groups
	if err := checkLen("codes", len(t.Codes), t.N*t.K); err != nil {
		return err
	}
	if err := checkLen("scales", len(t.Scales), ng); err != nil {
		return err
	}
	if err := t.validateZerosAndOffsets(ng); err != nil {
		return err
	}
	if t.GIdx != nil {
		if err := checkLen("g_idx", len(t.GIdx), t.K); err != nil {
			return err
		}
		for k, g := range t.GIdx {
			if g < 0 || int(g) >= groups {
				return fmt.Errorf("g_idx[%d] = %d is outside [0, %d)", k, g, groups)
			}
		}
	}
	if err := t.validateCodes(); err != nil {
		return err
	}
	for i, v := range t.Scales {
		if v == 0 || math.IsInf(float64(v), 0) || v != v {
			return fmt.Errorf("scale %g at row %d, group %d: scales must be finite and non-zero", v, i/groups, i%groups)
		}
	}
	return nil
}

// validateCodes checks that every code is below 2^bits and, for FP8, not a NaN byte. Codes
// below 2^bits are exactly those whose bitwise OR is below 2^bits, which orBytes computes
// eight codes at a time; only a failure or FP8 needs the per-code loop.
func (t *Tensor) validateCodes() error {
	s := t.Scheme
	maxq := s.MaxQ()
	fp8 := s.Grid == FP8E4M3 || s.Grid == FP8Block
	if !fp8 && int(orBytes(t.Codes)) <= maxq {
		return nil
	}
	for i, c := range t.Codes {
		if int(c) > maxq || (fp8 && c&0x7f == 0x7f) {
			return fmt.Errorf("code %#x at row %d, column %d is not a valid %s code", c, i/t.K, i%t.K, s)
		}
	}
	return nil
}

// orBytes returns the bitwise OR of all bytes of b.
func orBytes(b []byte) byte {
	var acc uint64
	i := 0
	for ; i+8 <= len(b); i += 8 {
		acc |= binary.LittleEndian.Uint64(b[i:])
	}
	for ; i < len(b); i++ {
		acc |= uint64(b[i])
	}
	for acc > 0xff {
		acc = acc>>8 | acc&0xff
	}
	return byte(acc)
}

// validateZerosAndOffsets checks the grid-specific per-group slices.
func (t *Tensor) validateZerosAndOffsets(ng int) error {
	s := t.Scheme
	groups := ng / t.N
	wantZeros, wantOffsets := 0, 0
	if s.Grid == Integer {
		wantZeros = ng
	}
	if s.Grid == Binary && !s.Sym {
		wantOffsets = ng
	}
	if err := checkLen("zeros", len(t.Zeros), wantZeros); err != nil {
		return err
	}
	if err := checkLen("offsets", len(t.Offsets), wantOffsets); err != nil {
		return err
	}
	maxq := s.MaxQ()
	for i, z := range t.Zeros {
		if int(z) > maxq || (s.Sym && int(z) != (maxq+1)/2) {
			return fmt.Errorf("zero point %d at row %d, group %d is not valid for %s", z, i/groups, i%groups, s)
		}
	}
	for i, o := range t.Offsets {
		if math.IsInf(float64(o), 0) || o != o {
			return fmt.Errorf("offset %g at row %d, group %d is not finite", o, i/groups, i%groups)
		}
	}
	return nil
}

func checkLen(what string, got, want int) error {
	if got != want {
		return fmt.Errorf("%s: have %d values, want %d", what, got, want)
	}
	return nil
}
