package convert

import (
	"fmt"

	"github.com/qpack-dev/qpack/blockwise"
	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/packing"
	"github.com/qpack-dev/qpack/quant"
)

// Devices (cuda.Select's choices).
const (
	DeviceAuto = cuda.ChoiceAuto // the GPU when a driver and a device are there, else the CPU
	DeviceCPU  = cuda.ChoiceCPU
	DeviceCUDA = cuda.ChoiceCUDA // the GPU or an error
)

// gpu is the GPU side of a conversion: nil means everything runs on the CPU.
type gpu struct {
	dev *cuda.Device
	q   *blockwise.GPUQuantizer
}

// openGPU opens the first GPU as the device option asks. With "auto" a missing driver or
// device is not an error: the conversion says so and runs on the CPU.
func openGPU(device string, logf func(format string, args ...any)) (*gpu, error) {
	dev, note, err := cuda.Select(device)
	if note != "" {
		logf("%s\n", note)
	}
	if err != nil || dev == nil {
		return nil, err
	}
	q, err := blockwise.NewGPUQuantizer(dev)
	if err != nil {
		dev.Close()
		return nil, err
	}
	logf("quantizing on %s\n", dev.Info().Name)
	return &gpu{dev: dev, q: q}, nil
}

func (g *gpu) close() {
	if g != nil {
		g.q.Close()
		g.dev.Close()
	}
}

// supports says whether the GPU path can quantize this item into format f exactly as the CPU
// would; clipping searches run on the CPU.
func (g *gpu) supports(s quant.Scheme, f packing.Format, opt Options) bool {
	return g != nil && !opt.Clip && g.q.Supports(s, f.Name())
}

// checkDevicePlan refuses, with --device cuda, a plan that has a tensor the GPU cannot do:
// the exit code promises the plan was carried out exactly as asked.
func checkDevicePlan(g *gpu, device string, items []Item, f packing.Format, opt Options) error {
	if device != DeviceCUDA {
		return nil
	}
	for _, it := range items {
		if it.Scheme != nil && !g.supports(*it.Scheme, f, opt) {
			return fmt.Errorf("tensor %s: %s in the %s layout%s has no GPU kernel; use --device auto to run it on the CPU",
				it.Info.Name, it.Scheme, f.Name(), map[bool]string{true: " with --clip", false: ""}[opt.Clip])
		}
	}
	return nil
}

// slots is how many modules are quantized at once ahead of the writer: one per quantizer slot.
func (g *gpu) slots() int {
	if g == nil {
		return blockwise.DefaultGPUSlots // only tests run modules ahead without a GPU
	}
	return g.q.Slots()
}

// stats says where the GPU quantizer's time went (zero without a GPU).
func (g *gpu) stats() blockwise.GPUStats {
	if g == nil {
		return blockwise.GPUStats{}
	}
	return g.q.Stats()
}
