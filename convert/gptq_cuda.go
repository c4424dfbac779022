package convert

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/gptq"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

// gpuCapture is the GPU side of a GPTQ calibration: the forward passes run on the GPU
// (model.GPU, TF32 GEMMs) and each linear group's Gram matrix Σ xᵀx accumulates there in
// float32, where the solver reads it (gpuSolveFunc).
type gpuCapture struct {
	e     *model.GPU
	grams map[string]*deviceGram
	solve time.Duration // time in Update: downloading Hessians, solving, replacing weights
}

type deviceGram struct {
	sum  cuda.DevicePtr // k×k float32
	k, n int            // width, rows accumulated
}

// calibrateOnGPU runs the calibration through the GPU forward pass with cal observing (the
// runner itself for GPTQ, its AWQ scaler for AWQ).
func (r *blockRunner) calibrateOnGPU(m *model.Model, seqs [][]int, cal model.GPUCalibrator, opt model.CalibrateOptions) error {
	e, err := model.NewGPU(r.dev, m.Config, r.math)
	if err != nil {
		return err
	}
	defer e.Close()
	r.gpu = &gpuCapture{e: e, grams: map[string]*deviceGram{}}
	defer r.gpu.free()
	start := time.Now()
	if err := e.Calibrate(m, seqs, cal, opt); err != nil {
		return err
	}
	total := time.Since(start)
	r.gpuPeak = e.PeakMemoryUsed()
	if r.awq != nil && !r.awq.gptq {
		return nil // AWQ's own line tells where the time went
	}
	ct := e.CalibrationTimes()
	r.logf("%s on %s: %d×%d calibration tokens, %.1f s: forward passes and Hessians %.1f s (weights up %.1f s, observing passes %.1f s, replaced weights up %.1f s, block outputs %.1f s), GPTQ %.1f s; peak GPU memory in use %.2f GB\n",
		r.method, r.dev.Info().Name, len(seqs), len(seqs[0]), total.Seconds(), (total - r.gpu.solve).Seconds(),
		ct.Upload.Seconds(), ct.Observe.Seconds(), ct.Refresh.Seconds(), ct.Output.Seconds(), r.gpu.solve.Seconds(), float64(e.PeakMemoryUsed())/1e9)
	return nil
}

func (c *gpuCapture) free() {
	for _, g := range c.grams {
		c.e.Device().Free(g.sum)
	}
}

// ObserveGPU adds x's Gram matrix to its group's sum.
func (r *blockRunner) ObserveGPU(block int, g model.Group, x cuda.DevicePtr, rows, cols int) error {
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
		r.experts.start(block, g)
		if err := r.dev.Fill32(p, 0, cols*cols); err != nil {
			return err
		}
	}
	r.experts.add(block, g, rows)
	if rows == 0 { // an expert no token of this chunk was routed to
		return nil
	}
	gr.n += rows
	return r.gpu.e.AddGram(gr.sum, x, rows, cols)
}

// gpuSolveFunc solves with group g's Gram matrix where it was gathered, on the GPU
// (gptq.GPUSolver.QuantizeGram: H = 2/n·Σ xᵀx is made there; only its diagonal comes back).
func (r *blockRunner) gpuSolveFunc(block int, g model.Group) (solveFunc, func(), error) {
	key := hessianKey(block, g)
	gr := r.gpu.grams[key]
	if gr == nil || gr.n == 0 {
		return nil, nil, fmt.Errorf("block %d: no calibration inputs reached %s", block, g)
	}
	delete(r.gpu.grams, key)
	release := func() { r.dev.Free(gr.sum) }
	if err := r.gpu.e.Synchronize(); err != nil { // the Gram's last accumulation
		release()
		return nil, nil, err
	}
	var host []float64 // H on the host, fetched for the first linear the CPU solves
	var hostOnce sync.Once
	var hostErr error
	solve := func(l *model.Linear, s quant.Scheme, global float32, solver *gptq.GPUSolver) (*quant.Tensor, gptq.Stats, error) {
		w, n, k := l.W, l.Out, l.In
		if solver != nil && solver.Supports(s, r.opt) {
			var t *quant.Tensor
			var st gptq.Stats
			var err error
			// GPTQ alone leaves the engine's copy equal to l.W (AWQ folds its scales into l.W
			// first): then it is copied on the device instead of sent over the bus again.
			if src, ok := r.gpu.e.LinearWeights(l); ok && r.awq == nil {
				t, st, err = solver.QuantizeGramResident(w, src, n, k, gr.sum, 2/float64(gr.n), s, r.opt)
			} else {
				t, st, err = solver.QuantizeGram(w, n, k, gr.sum, 2/float64(gr.n), s, r.opt)
			}
			if err != nil {
				err = fmt.Errorf("block %d, input of %s: %w", block, g, err)
			}
			return t, st, err
		}
		hostOnce.Do(func() { host, hostErr = r.hostHessian(gr) }) // NF4, k-quants (or the clip search off amd64): the CPU solves
		if hostErr != nil {
			return nil, gptq.Stats{}, fmt.Errorf("block %d, Hessian of %s: %w", block, g, hostErr)
		}
		return gptq.Quantize(w, n, k, host, s, r.optFor(global))
	}
	return solve, release, nil
}

// hostHessian brings a Gram matrix gathered on the GPU to the host as the CPU solver's
// H = 2/n·Σ xᵀx in float64. The GEMM that summed it may round (i, j) and (j, i) differently,
// so the two are averaged: the solver requires an exactly symmetric H.
func (r *blockRunner) hostHessian(gr *deviceGram) ([]float64, error) {
	k := gr.k
	buf := make([]byte, 4*k*k)
	if err := r.dev.CopyFromDevice(buf, gr.sum); err != nil {
		return nil, err
	}
	at := func(i int) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))) }
	h := make([]float64, k*k)
	scale := 1 / float64(gr.n) // 2/n · ½(a + b)
	for i := 0; i < k; i++ {
		for j := i; j < k; j++ {
			v := scale * (at(i*k+j) + at(j*k+i))
			h[i*k+j], h[j*k+i] = v, v
		}
	}
	return h, nil
}

func hessianKey(block int, g model.Group) string { return fmt.Sprintf("%d/%s", block, g) }
