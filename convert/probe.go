package convert

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/model"
	"github.com/qpack-dev/qpack/quant"
)

// probeTokens is about how many calibration tokens the output probe runs: enough for a stable
// mean KL (the coefficients it gives vary by 100× between linears, its noise by percents).
const probeTokens = 2048

// probeScheme is what each linear is quantized to for its probe: a middle rung, where the
// KL is still in its quadratic regime yet well above float rounding.
var probeScheme = quant.Scheme{Bits: 4, GroupSize: 128, Grid: quant.Integer}

// probeBlocks is how many decoder blocks, evenly spaced with the first and the last among
// them, have their linears probed; the others' coefficients are interpolated along the depth
// (interpolateCoefficients). Each probe costs a quantization on the CPU and a pass through the
// blocks after it, so a 32-block 7B probes a quarter of them within the plan's minute on a GPU;
// a model of at most this many blocks is probed whole.
const probeBlocks = 8

// probeMemory bounds the hidden states the probe keeps at once, in host or GPU memory.
const probeMemory = 8 << 30

// outputCoefficients measures, for every decoder linear, α = KL/e²: the mean KL divergence of
// the model's next-token distributions over the first probeTokens calibration tokens when
// that linear alone is quantized to probeScheme by plain round-to-nearest, divided by the
// relative error energy e² of that quantization, weighted by the input channels' importance
// like the planner's measurements. The planner then rates a rung of a tensor by α·e² (an
// estimate of the KL it costs) instead of e² alone, which counts an error in q_proj as much as
// the same relative error in down_proj although their KL per unit of e² differs by two orders
// of magnitude. Plain RTN, not the rung's own fit: α is a property of the linear's place in the
// model, and min-max groups cost a 7B's probe seconds where the weighted search would cost
// minutes on the CPU.
func outputCoefficients(ctx context.Context, src string, c *Calibration, importance map[string][]float32,
	device string, ordinals []int, calibMath string, logf func(format string, args ...any)) (map[string]float64, error) {
	engine, err := calibEngineOptions(calibMath)
	if err != nil {
		return nil, err
	}
	m, err := model.Open(src)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	seqs := c.seqs[:min(len(c.seqs), max(1, (probeTokens+c.SeqLen-1)/c.SeqLen))]
	errEnergy := map[string]float64{} // written by the probe's preparing goroutines, under mu
	var mu sync.Mutex
	probed := probedBlocks(m.Config.Layers)
	replace := func(l *model.Linear) ([]float32, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if t := model.ParseTensorName(l.Name + ".weight"); !probed[t.Block] || !t.Role.IsLinear() {
			return nil, nil // routers and shared-expert gates are kept
		}
		q, err := blockwise.Quantize(l.W, l.Out, l.In, probeScheme, blockwise.Options{})
		if err != nil {
			return nil, fmt.Errorf("output probe of %s: %w", l.Name, err)
		}
		wq := q.Dequantize(nil)
		var e float64
		if imp := importance[l.Name]; imp != nil {
			e = quant.WeightedRelativeError(l.W, wq, l.Out, l.In, imp)
		} else {
			e = quant.RelativeError(l.W, wq)
		}
		mu.Lock()
		defer mu.Unlock()
		errEnergy[l.Name] = e * e
		return wq, nil
	}
	devs, note, err := cuda.SelectMany(device, ordinals)
	if note != "" {
		logf("%s\n", note)
	}
	if err != nil {
		return nil, err
	}
	defer closeDevices(devs)
	start, where := time.Now(), "the CPU"
	progress := func(done, total int) { logf("plan: output probe: %d of %d linears\n", done, total) }
	var kl map[string]float64
	if devs == nil {
		kl, err = model.LinearKL(m, seqs, replace, probeMemory, progress)
	} else {
		where = gpuNames(devs)
		m.SetBlockReaders(gpuPassReaders)
		m.SetRawLinears(func(block int) bool { return !probed[block] }) // only uploaded: as stored, widened there
		var engines []*model.GPU
		engines, err = newEngines(devs, m.Config, engine)
		defer closeEngines(engines)
		if err == nil {
			kl, err = model.LinearKLSharded(engines, m, seqs, replace, probeMemory, progress)
		}
	}
	if err != nil {
		return nil, err
	}
	alpha := map[string]float64{}
	for name, v := range kl {
		if e := errEnergy[name]; e > 0 {
			alpha[name] = v / e
		}
	}
	logf("plan: output probe: KL of %d linears in %d of %d blocks, each alone at %s, over %d×%d calibration tokens on %s in %.1f s\n",
		len(kl), len(probed), m.Config.Layers, probeScheme, len(seqs), c.SeqLen, where, time.Since(start).Seconds())
	interpolateCoefficients(alpha, probed, m.Config.Layers)
	return alpha, nil
}

// probedBlocks picks probeBlocks blocks of layers, evenly spaced, the first and the last included.
func probedBlocks(layers int) map[int]bool {
	n := min(layers, probeBlocks)
	picked := map[int]bool{}
	for i := range n {
		picked[int(math.Round(float64(i*(layers-1))/float64(max(1, n-1))))] = true
	}
	return picked
}

// interpolateCoefficients gives each linear of a block between two probed ones the geometric
// interpolation of the same linear's coefficients there (they span orders of magnitude, and
// change smoothly with depth away from the edges, which are probed).
func interpolateCoefficients(alpha map[string]float64, probed map[int]bool, layers int) {
	for b := range layers {
		if probed[b] {
			continue
		}
		lo, hi := b, b
		for !probed[lo] {
			lo--
		}
		for !probed[hi] {
			hi++
		}
		f := float64(b-lo) / float64(hi-lo)
		at := func(block int) string { return fmt.Sprintf(".layers.%d.", block) }
		for name, a := range alpha {
			if !strings.Contains(name, at(lo)) {
				continue
			}
			if z, ok := alpha[strings.Replace(name, at(lo), at(hi), 1)]; ok {
				alpha[strings.Replace(name, at(lo), at(b), 1)] = math.Exp((1-f)*math.Log(a) + f*math.Log(z))
			}
		}
	}
}

// medianCoefficient is the coefficient for tensors the probe does not reach (embeddings,
// lm_head when quantized): the middle of the measured ones.
func medianCoefficient(alpha map[string]float64) float64 {
	var v []float64
	for _, a := range alpha {
		v = append(v, a)
	}
	if len(v) == 0 {
		return 1
	}
	slices.Sort(v)
	return v[len(v)/2]
}
