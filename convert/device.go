package convert

import (
	"fmt"
	"sync"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/timeline"
	"github.com/qpack-dev/qpack/iquant"
	"github.com/qpack-dev/qpack/kquant"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
	"github.com/qpack-dev/qpack/safetensors"
)

// Devices (cuda.Select's choices).
const (
	DeviceAuto = cuda.ChoiceAuto // the GPU when a driver and a device are there, else the CPU
	DeviceCPU  = cuda.ChoiceCPU
	DeviceCUDA = cuda.ChoiceCUDA // the GPU or an error
)

// DefaultGPUSlots is how many tensors a conversion has on the GPU at once (Options.GPUSlots).
// A slot stays taken while its results are written from its pinned memory, so a conversion
// needs more than one uploading, one computing and one downloading; on a synthetic 7B (README)
// 3 and 4 slots were fastest and 6 to 12 slower. Each slot holds pinned and device memory the
// size of the largest tensor.
const DefaultGPUSlots = 4

// gpu is the GPU side of a conversion: nil means everything runs on the CPU.
type gpu struct {
	dev     *cuda.Device   // the first GPU: RTN's kernels run there
	devs    []*cuda.Device // every GPU of the conversion, dev first: GPTQ calibrates on all
	q       *blockwise.GPUQuantizer
	imatrix *blockwise.GPUImatrix // --imatrix's search
	kq      *kquant.GPUFitter     // k-quants (with or without --imatrix); nil until useKQuants
	iq      *iquant.GPUFitter     // IQ types (likewise)
}

// openGPU opens the GPUs as the device option asks: the ordinals given, or every GPU. With
// "auto" a missing driver or device is not an error: the conversion says so and runs on the CPU.
func openGPU(device string, ordinals []int, slots int, logf func(format string, args ...any)) (*gpu, error) {
	end := timeline.Begin(timeline.Host, "GPU contexts")
	devs, note, err := cuda.SelectMany(device, ordinals)
	end()
	if note != "" {
		logf("%s\n", note)
	}
	if err != nil || len(devs) == 0 {
		return nil, err
	}
	g := &gpu{dev: devs[0], devs: devs}
	defer timeline.Begin(timeline.Host, "quantizers and peer access")()
	if err := g.open(slots, logf); err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

// open prepares the first GPU's RTN kernels and lets the GPUs reach each other's memory.
func (g *gpu) open(slots int, logf func(format string, args ...any)) error {
	if slots <= 0 {
		slots = DefaultGPUSlots
	}
	var err error
	if g.q, err = blockwise.NewGPUQuantizerSlots(g.dev, slots); err != nil {
		return err
	}
	if g.imatrix, err = blockwise.NewGPUImatrix(g.dev); err != nil {
		return err
	}
	if len(g.devs) == 1 {
		logf("quantizing on %s\n", g.dev.Info().Name)
		return nil
	}
	direct, err := cuda.EnablePeerAccess(g.devs)
	if err != nil {
		return err
	}
	n := len(g.devs)
	logf("quantizing on %d GPUs (%s; calibration on all, the rest on the first); %d of %d pairs reach each other's memory directly\n",
		n, g.dev.Info().Name, direct, n*(n-1))
	return nil
}

// useKQuants loads the k-quant fit when RTN has k-quant tensors to quantize, and the IQ fit when
// it has IQ tensors: only then, as the driver compiles their PTX on the first load (about a
// second) and other conversions need not wait.
func (g *gpu) useKQuants(items []Item) error {
	if g == nil {
		return nil
	}
	var err error
	for _, it := range items {
		switch {
		case it.Scheme == nil:
		case it.Scheme.Grid == quant.KQuant && g.kq == nil:
			g.kq, err = kquant.NewGPUFitterSlots(g.dev, g.q.Slots()) // workers() counts on as many slots
		case it.Scheme.Grid == quant.IQuant && g.iq == nil:
			g.iq, err = iquant.NewGPUFitter(g.dev)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (g *gpu) close() {
	if g == nil {
		return
	}
	defer timeline.Begin(timeline.Host, "close the GPUs")()
	if g.kq != nil {
		g.kq.Close()
	}
	if g.iq != nil {
		g.iq.Close()
	}
	if g.imatrix != nil {
		g.imatrix.Close()
	}
	if g.q != nil {
		g.q.Close()
	}
	closeDevices(g.devs)
}

// holdGPUs opens the GPUs that the plan's passes (statistics, output probe) will open and close
// each, and a conversion's method after them: held from before the first pass until the method
// has its own handles (or the plan is done), each GPU's context is made once (0.1–0.5 s on each of
// four H100s, one after another) instead of once per pass. Nil where no pass runs on GPUs; errors
// are left to the passes.
func holdGPUs(opt Options, calib *Calibration) []*cuda.Device {
	if calib == nil || !planPassesOnGPUs(opt) {
		return nil
	}
	devs, _, err := cuda.SelectMany(opt.Device, opt.Devices)
	if err != nil {
		return nil
	}
	return devs
}

// planPassesOnGPUs says whether the plan's passes over calibration data (statistics, output
// probe; given the data) may run, on every GPU of the conversion.
func planPassesOnGPUs(opt Options) bool {
	return opt.Plan == nil && opt.Device != DeviceCPU && (needsMeasurement(opt.Alloc) || opt.Imatrix)
}

// GPUsUsed are the ordinals of the GPUs a conversion with options opt may open (nil: every GPU
// the driver sees): RTN without the plan's passes runs on the first of Devices only.
func GPUsUsed(opt Options) []int {
	if opt.Method.Calibrates() || planPassesOnGPUs(opt) {
		return opt.Devices
	}
	return firstDevice(opt.Devices)
}

// firstDevice is the first of ordinals, GPU 0 when they are every GPU (nil).
func firstDevice(ordinals []int) []int {
	if len(ordinals) == 0 {
		return []int{0}
	}
	return ordinals[:1]
}

// closeDevices releases the GPUs' contexts, all at once (each release frees its memory).
func closeDevices(devs []*cuda.Device) {
	var closing sync.WaitGroup
	for _, d := range devs {
		closing.Go(func() { d.Close() })
	}
	closing.Wait()
}

// supports says whether the GPU path can quantize this item into format f exactly as the CPU
// would; clipping searches run on the CPU.
func (g *gpu) supports(s quant.Scheme, f packing.Format, opt Options) bool {
	return g != nil && !opt.Clip && !opt.Imatrix && g.q.Supports(s, f.Name())
}

// searches says whether the GPU runs the --imatrix search of this item's groups (the CPU then
// encodes with the parameters found): integer grids.
func (g *gpu) searches(s quant.Scheme, opt Options) bool {
	return g != nil && opt.Imatrix && g.imatrix.Supports(s)
}

// fits says whether the GPU fits this item's k-quant super-blocks or IQ blocks (with their
// importance under --imatrix; the CPU then packs the tensor it returns).
func (g *gpu) fits(s quant.Scheme, opt Options) bool {
	return g != nil && !opt.Clip && ((g.kq != nil && g.kq.Supports(s)) || (g.iq != nil && g.iq.Supports(s)))
}

// fitsBlocks says whether the GPU fits this GGUF item's k-quant super-blocks and packs them into
// ggml's blocks there, reading the weights as stored: rows of whole blocks, weights in BF16, F16
// or F32, and no --measure-error (it needs the fitted tensor).
func (g *gpu) fitsBlocks(it Item, f packing.Format, opt Options) bool {
	_, dtype := gpuDTypes[it.Info.DType]
	return g != nil && g.kq != nil && isGGUF(f) && !opt.Clip && !opt.MeasureError && dtype &&
		g.kq.Supports(*it.Scheme) && it.K()%quant.SuperBlock == 0
}

// gpuDTypes are the stored dtypes the GPU reads as they are.
var gpuDTypes = map[safetensors.DType]cuda.DType{safetensors.BF16: cuda.BF16, safetensors.F16: cuda.F16, safetensors.F32: cuda.F32}

// checkDevicePlan refuses, with --device cuda, a plan that has a tensor the GPU cannot do:
// the exit code promises the plan was carried out exactly as asked.
func checkDevicePlan(g *gpu, device string, items []Item, f packing.Format, opt Options) error {
	if device != DeviceCUDA {
		return nil
	}
	for _, it := range items {
		if it.Scheme != nil && !g.supports(*it.Scheme, f, opt) && !g.searches(*it.Scheme, opt) && !g.fits(*it.Scheme, opt) {
			return fmt.Errorf("tensor %s: %s in the %s layout%s has no GPU kernel; use --device auto to run it on the CPU",
				it.Info.Name, it.Scheme, f.Name(), searchFlag(opt))
		}
	}
	return nil
}

// testWorkers, when set, replaces workers' answer: tests compare outputs across worker counts.
var testWorkers int

// workers is how many output units run at once: on the GPU one per quantizer slot and one
// more, so that a slot's results are written while the others read and compute; on the CPU
// two, so that one module is written while the next is quantized (each uses every core).
func (g *gpu) workers() int {
	if testWorkers > 0 {
		return testWorkers
	}
	if g == nil {
		return 2
	}
	return g.q.Slots() + 1
}

// stats says where the GPU quantizer's and the k-quant fitter's time went (zero without a GPU).
func (g *gpu) stats() cuda.SlotStats {
	if g == nil {
		return cuda.SlotStats{}
	}
	st := g.q.Stats()
	if g.kq != nil {
		st = st.Plus(g.kq.Stats())
	}
	return st
}

// searchFlag names the CPU-only group search in use, for errors.
func searchFlag(opt Options) string {
	switch {
	case opt.Imatrix:
		return " with --imatrix"
	case opt.Clip:
		return " with --clip"
	}
	return ""
}
