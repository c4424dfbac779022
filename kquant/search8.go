package kquant

import "unsafe"

// scaleMin8 is the work space of fitScaleMin8: eight sub-blocks of 32 weights side by side, so
// that one AVX2 lane follows each sub-block through fitScaleMin's arithmetic, in its order and
// without fused multiply-adds: the same bits as the scalar code, eight at once. The assembly
// reads the fields at fixed offsets (TestScaleMin8Layout).
type scaleMin8 struct {
	x, w   [32 * 8]float32 // value i of lane j at [8i+j]
	l, aux [32 * 8]int32   // codes, same layout; aux is scratch
	steps  [64]float32     // (rmin + rdelta·is) + nmax for is = 0 … nstep
	nmax   [8]int32
	scale  [8]float32 // out
	negMin [8]float32 // out
	lo0    [8]float32 // scratch: min(x, 0), for the all-equal lanes
	count  int64      // nstep + 1
}

// scaleMin8Offsets are the byte offsets the assembly uses.
var scaleMin8Offsets = [...]uintptr{
	unsafe.Offsetof(scaleMin8{}.x), unsafe.Offsetof(scaleMin8{}.w), unsafe.Offsetof(scaleMin8{}.l),
	unsafe.Offsetof(scaleMin8{}.aux), unsafe.Offsetof(scaleMin8{}.steps), unsafe.Offsetof(scaleMin8{}.nmax),
	unsafe.Offsetof(scaleMin8{}.scale), unsafe.Offsetof(scaleMin8{}.negMin), unsafe.Offsetof(scaleMin8{}.lo0),
	unsafe.Offsetof(scaleMin8{}.count),
}

// fitScaleMin8 is fitScaleMin (mad false) on up to eight sub-blocks of 32 weights, x and w
// holding them one after another, on the AVX2 kernel; codes receives their codes in the same
// order. It reports false, doing nothing, where the kernel does not apply.
func fitScaleMin8(nmax int32, x, w []float32, codes []uint8, sw sweep, scales, mins []float32) bool {
	nsub := len(x) / 32
	if !hasAVX2 || sw.mad || nsub == 0 || nsub > 8 || len(x) != 32*nsub || sw.nstep+1 > len(scaleMin8{}.steps) {
		return false
	}
	var s scaleMin8
	for j := range nsub {
		for i := range 32 {
			s.x[8*i+j], s.w[8*i+j] = x[32*j+i], w[32*j+i]
		}
	}
	for is := range sw.nstep + 1 {
		s.steps[is] = float32(sw.rmin+float32(sw.rdelta*float32(is))) + float32(nmax)
	}
	for j := range s.nmax {
		s.nmax[j] = nmax
	}
	s.count = int64(sw.nstep + 1)
	scaleMin8AVX2(&s)
	for j := range nsub {
		scales[j], mins[j] = s.scale[j], s.negMin[j]
		for i := range 32 {
			codes[32*j+i] = uint8(s.l[8*i+j])
		}
	}
	return true
}
