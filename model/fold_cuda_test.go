package model

import (
	"math"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
)

// ScaleColumns, DivideLinearRows and DivideNorm leave the engine's copy of a block equal, bit for bit, to the host's
// weights after the same float32 products and quotients, biases and norms included; after
// KeepDeviceWeights the refresh uploads nothing (the host's copy, left as it was, is not what the
// GPU holds then), and outside an Update they refuse.
func TestGPUFoldOnDevice(t *testing.T) {
	cfg := mustConfig(t, gpuTestConfigs[1].json) // q/k/v biases
	r := freshRand(t)
	m := randomModel(t, cfg, gpuTestConfigs[1].bias, r)
	e := openGPU(t, cfg, GPUOptions{TF32: true, F16: true}, 0)
	b, g := uploadFirstBlock(t, e, m)
	if err := e.ScaleColumns(b.Q, make([]float32, b.Q.In)); err == nil {
		t.Error("ScaleColumns outside an Update did not refuse")
	}
	scales := func(n int) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(math.Exp(r.NormFloat64())) // quotients and products that round
		}
		return s
	}
	sq, sv := scales(b.Q.In), scales(b.V.Out)
	want := map[string][]float32{}
	for name, v := range map[string][]float32{"q": b.Q.W, "v": b.V.W, "v bias": b.V.Bias, "norm": b.InputNorm} {
		want[name] = append([]float32(nil), v...)
	}
	for i := range want["q"] {
		want["q"][i] *= sq[i%b.Q.In]
	}
	for i := range want["v"] {
		want["v"][i] /= sv[i/b.V.In]
	}
	for i := range want["v bias"] {
		want["v bias"][i] /= sv[i]
	}
	for i := range want["norm"] {
		want["norm"][i] /= sq[i]
	}
	e.current = g
	for _, err := range []error{e.ScaleColumns(b.Q, sq), e.DivideLinearRows(b.V, sv), e.DivideNorm(b.InputNorm, sq), e.KeepDeviceWeights()} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := e.DivideNorm(b.InputNorm, sv[:1]); err == nil {
		t.Error("DivideNorm took a norm with the wrong number of scales")
	}
	if err := e.refresh(g, []Group{GroupQKV}, nil); err != nil {
		t.Fatal(err)
	}
	e.current = nil
	if g.deviceCurrent {
		t.Error("the refresh left the block marked as changed on the device")
	}
	for name, at := range map[string]cuda.DevicePtr{"q": g.q.w, "v": g.v.w, "v bias": g.v.bias, "norm": g.inNorm} {
		got := make([]float32, len(want[name]))
		if err := e.dev.CopyFromDevice(cuda.Bytes(got), at); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[name][i]) {
				t.Fatalf("%s[%d]: %g on the GPU, %g on the host", name, i, got[i], want[name][i])
			}
		}
	}
}
