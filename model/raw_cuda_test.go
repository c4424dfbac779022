package model

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/safetensors"
)

// TestGPURawUploads: blocks read raw (SetRawLinears) from BF16, F16 and F32 checkpoints hold on
// the GPU the float32 weights of the same blocks read as float32, bit for bit: uploaded to one
// engine (uploadBlock), shared by three engines (uploadShards: shares cut inside the raw
// weights, the other shares copied between the GPUs), and uploaded ahead to the three
// (uploadAll through their second streams); each upload's 16-bit copies are made from them. A
// NaN in a BF16 or F16 weight is an error naming the tensor and the index, on one engine and on
// three (whichever GPU's share holds it), and an upload ahead that meets it places nothing.
func TestGPURawUploads(t *testing.T) {
	for _, d := range []safetensors.DType{safetensors.BF16, safetensors.F16, safetensors.F32} {
		t.Run(string(d), func(t *testing.T) {
			dir := tinyAs(t, d, "")
			ref, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			m, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			m.SetRawLinears(func(int) bool { return true })
			es := openGPUs(t, m.Config, GPUOptions{F16: true, TF32: true}, 0, 3)
			blocks := make([]*Block, 2)
			for i := range blocks {
				if blocks[i], err = m.Block(i); err != nil {
					t.Fatal(err)
				}
				if blocks[i].Q.W != nil {
					t.Fatalf("block %d was not read raw", i)
				}
			}
			g, err := es[0].uploadBlock(blocks[0])
			if err != nil {
				t.Fatal(err)
			}
			sameWeights(t, "one engine", es[0], g, ref)
			es[0].freeBlock(g)
			gs, err := uploadShards(es, blocks[0])
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range es {
				sameWeights(t, fmt.Sprintf("engine %d of 3", i), e, gs[i], ref)
			}
			freeShards(es, gs)
			ahead := uploadAhead(es, m, 1)
			if gs, err = ahead.take(es, blocks[1]); err != nil || gs == nil {
				t.Fatalf("block 1 uploaded ahead: %v (placed: %v)", err, gs != nil)
			}
			for i, e := range es {
				sameWeights(t, fmt.Sprintf("engine %d of 3, ahead", i), e, gs[i], ref)
			}
			freeShards(es, gs)
			if d != safetensors.F32 {
				rawNaN(t, d, es)
			}
		})
	}
}

// rawNaN uploads the first block of tiny in d with a NaN in down_proj (index 5), read raw, to
// es[0] and to all of es (errors naming it), and ahead (nothing placed).
func rawNaN(t *testing.T, d safetensors.DType, es []*GPU) {
	t.Helper()
	bad := "model.layers.0.mlp.down_proj.weight"
	m, err := Open(tinyAs(t, d, bad))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.SetRawLinears(func(int) bool { return true })
	b, err := m.Block(0)
	if err != nil {
		t.Fatalf("a NaN read raw from %s: %v (found on the GPU, not here)", d, err)
	}
	want := fmt.Sprintf("%q has a non-finite value at index 5", bad)
	if g, err := es[0].uploadBlock(b); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("one engine: %v, want an error saying %s", err, want)
		if g != nil {
			es[0].freeBlock(g)
		}
	}
	gs, err := uploadShards(es, b)
	freeShards(es, gs)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("three engines: %v, want an error saying %s", err, want)
	}
	ahead := uploadAhead(es, m, 0)
	if gs, err := ahead.take(es, b); gs != nil || err != nil {
		freeShards(es, gs)
		t.Errorf("uploaded ahead with a NaN: placed %v, %v", gs != nil, err)
	}
}

// sameWeights wants every linear's weights in g on e to be, bit for bit, those of the same block
// of ref read as float32.
func sameWeights(t *testing.T, where string, e *GPU, g *gpuBlock, ref *Model) {
	t.Helper()
	if err := e.Synchronize(); err != nil {
		t.Fatal(err)
	}
	want, err := ref.Block(g.b.Index)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range g.b.AllLinears() {
		got := make([]float32, l.Out*l.In)
		if err := e.dev.CopyFromDevice(cuda.Bytes(got), g.lin[l].w); err != nil {
			t.Fatal(err)
		}
		for j, v := range want.AllLinears()[i].W {
			if math.Float32bits(got[j]) != math.Float32bits(v) {
				t.Errorf("%s: block %d, %s, weight %d: %g on the GPU, %g read as float32", where, g.b.Index, l.Name, j, got[j], v)
				break
			}
		}
	}
}
