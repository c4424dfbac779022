package model

import (
	"fmt"

	"github.com/qpack-dev/qpack/cuda"
)

// A calibrator's Update may change the engine's copy of the block it is calibrating itself, instead
// of changing the host's weights for the engine to upload: AWQ folds its scales in with ScaleColumns,
// DivideLinearRows and DivideNorm, which round each value as the host's float32 product or quotient does (the host's
// copy, folded the same way, stays equal bit for bit), and GPTQ writes its dequantized weights
// there from its solver (gptq.GPUSolver.DequantizeTo). KeepDeviceWeights then spares the upload
// after the Update.

// ScaleColumns multiplies column c of linear l's weights by s[c] in the engine's copy of the
// block being calibrated; call it from Update only.
func (e *GPU) ScaleColumns(l *Linear, s []float32) error {
	d, err := e.currentLinear(l, len(s), l.In)
	if err != nil {
		return err
	}
	return e.onDevice(e.fn.scaleColumns, d.w, s, d.out*d.in, d.in)
}

// DivideLinearRows divides row r of linear l's weights and bias by s[r] in the engine's copy of the
// block being calibrated; call it from Update only.
func (e *GPU) DivideLinearRows(l *Linear, s []float32) error {
	d, err := e.currentLinear(l, len(s), l.Out)
	if err != nil {
		return err
	}
	if err := e.onDevice(e.fn.divideRows, d.w, s, d.out*d.in, d.in); err != nil {
		return err
	}
	if d.bias == 0 {
		return nil
	}
	return e.onDevice(e.fn.divideRows, d.bias, s, d.out, 1)
}

// DivideNorm divides value r of norm, the input or post-attention norm weight of the block being
// calibrated, by s[r] in the engine's copy; call it from Update only.
func (e *GPU) DivideNorm(norm []float32, s []float32) error {
	g := e.current
	if g == nil {
		return fmt.Errorf("model: DivideNorm outside a calibration's Update")
	}
	for _, n := range []struct {
		host []float32
		dev  cuda.DevicePtr
	}{{g.b.InputNorm, g.inNorm}, {g.b.PostAttnNorm, g.postNorm}} {
		if len(norm) > 0 && len(n.host) == len(norm) && &n.host[0] == &norm[0] && len(s) == len(norm) {
			return e.onDevice(e.fn.divideRows, n.dev, s, len(norm), 1)
		}
	}
	return fmt.Errorf("model: DivideNorm: not a norm of block %d with %d values", g.b.Index, len(s))
}

// KeepDeviceWeights tells the engine that the Update in progress has put every weight it changed
// into the engine's copy itself (ScaleColumns, DivideLinearRows, DivideNorm, or a GPTQ solver's DequantizeTo into
// LinearWeights): the refresh after it uploads nothing and only rounds the step's linears to 16
// bits again where the GEMMs read them so. What the host holds for those weights is then not read
// again by the calibration. Engines calibrating together skip the upload when all of them were told.
func (e *GPU) KeepDeviceWeights() error {
	if e.current == nil {
		return fmt.Errorf("model: KeepDeviceWeights outside a calibration's Update")
	}
	e.current.deviceCurrent = true
	return nil
}

// currentLinear is l's copy in the block being calibrated, checked to have n values along the
// dimension of size want.
func (e *GPU) currentLinear(l *Linear, n, want int) (*gpuLinear, error) {
	g := e.current
	if g == nil {
		return nil, fmt.Errorf("model: %s changed on the GPU outside a calibration's Update", l.Name)
	}
	d := g.lin[l]
	if d == nil || n != want {
		return nil, fmt.Errorf("model: %s is not in block %d on the GPU with %d scales", l.Name, g.b.Index, n)
	}
	return d, nil
}

// onDevice uploads s and queues kernel f over the n values of w, rows of cols.
func (e *GPU) onDevice(f cuda.Function, w cuda.DevicePtr, s []float32, n, cols int) error {
	sd, err := e.buffer("fold.s", 4*len(s))
	if err != nil {
		return err
	}
	if err := e.stager.CopyToDevice(sd, cuda.Bytes(s), e.stream); err != nil {
		return err
	}
	return e.elementwise(f, n, w, sd, int64(n), int32(cols))
}
