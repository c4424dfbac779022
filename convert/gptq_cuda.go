package convert

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/gptq"
	"github.com/qpack-dev/qpack/model"
)

// gpuCapture is the GPU side of a GPTQ calibration: the forward passes run on the GPU
// (model.GPU, TF32 GEMMs) and each linear group's Gram matrix Σ xᵀx accumulates there in
// float32; Update turns it into the float64 Hessian 2/n·Σ xᵀx the solver takes.
type gpuCapture struct {
	e     *model.GPU
	grams map[string]*deviceGram
	solve time.Duration // time in Update: downloading Hessians, solving, replacing weights
}

type deviceGram struct {
	sum  cuda.DevicePtr // k×k float32
	k, n int            // width, rows accumulated
}

// calibrateOnGPU runs the calibration through the GPU forward pass.
func (r *gptqRunner) calibrateOnGPU(m *model.Model, seqs [][]int, opt model.CalibrateOptions) error {
	e, err := model.NewGPU(r.dev, m.Config, model.GPUOptions{TF32: true})
	if err != nil {
		return err
	}
	defer e.Close()
	r.gpu = &gpuCapture{e: e, grams: map[string]*deviceGram{}}
	defer r.gpu.free()
	start := time.Now()
	if err := e.Calibrate(m, seqs, r, opt); err != nil {
		return err
	}
	total := time.Since(start)
	r.logf("gptq on %s: %d×%d calibration tokens, %.1f s: forward passes and Hessians %.1f s, GPTQ %.1f s; peak GPU memory in use %.2f GB\n",
		r.dev.Info().Name, len(seqs), len(seqs[0]), total.Seconds(), (total - r.gpu.solve).Seconds(), r.gpu.solve.Seconds(),
		float64(e.PeakMemoryUsed())/1e9)
	return nil
}

func (c *gpuCapture) free() {
	for _, g := range c.grams {
		c.e.Device().Free(g.sum)
	}
}

// ObserveGPU adds x's Gram matrix to its group's sum.
func (r *gptqRunner) ObserveGPU(block int, g model.Group, x cuda.DevicePtr, rows, cols int) error {
	if r.stopped.Load() {
		return errors.New("stopped")
	}
	key := hessianKey(block, g)
	gr := r.gpu.grams[key]
	if gr == nil {
		p, err := r.dev.Alloc(4 * cols * cols)
		if err != nil {
			return fmt.Errorf("block %d, Hessian of %s: %w", block, g, err)
		}
		gr = &deviceGram{sum: p, k: cols}
		r.gpu.grams[key] = gr
		if err := r.dev.Fill32(p, 0, cols*cols); err != nil {
			return err
		}
	}
	gr.n += rows
	return r.gpu.e.AddGram(gr.sum, x, rows, cols)
}

// downloadHessians turns the device Gram sums of block's groups into the runner's Hessians.
func (r *gptqRunner) downloadHessians(block int, groups []model.Group) error {
	if r.gpu == nil {
		return nil
	}
	if err := r.gpu.e.Synchronize(); err != nil {
		return err
	}
	for _, g := range groups {
		key := hessianKey(block, g)
		gr := r.gpu.grams[key]
		if gr == nil {
			continue
		}
		delete(r.gpu.grams, key)
		sum := make([]float32, gr.k*gr.k)
		err := r.dev.CopyFromDevice(cuda.Bytes(sum), gr.sum)
		if ferr := r.dev.Free(gr.sum); err == nil {
			err = ferr
		}
		if err != nil {
			return err
		}
		h := &gptq.Hessian{K: gr.k, N: gr.n, H: make([]float64, len(sum))}
		scale := 2 / float64(gr.n)
		for i, v := range sum {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("block %d, input of %s: non-finite activations (Gram matrix entry %d, %d is %g)", block, g, i/gr.k, i%gr.k, v)
			}
			h.H[i] = scale * float64(v)
		}
		r.hess[key] = h
	}
	return nil
}

func hessianKey(block int, g model.Group) string { return fmt.Sprintf("%d/%s", block, g) }
