//go:build !amd64 || purego

package vec

const hasAVX2 = false

func expSumAVX2(dst, src *float32, n int, shift float32) float64 { panic("vec: no AVX2 kernel") }
func maxAVX2(x *float32, n int) float32                          { panic("vec: no AVX2 kernel") }
func scaleAVX2(x *float32, n int, a float32)                     { panic("vec: no AVX2 kernel") }
