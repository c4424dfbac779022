package convert

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/imatrix"
	"github.com/qpack-dev/qpack/model"
)

// linearNames maps each decoder linear's module prefix to its llama.cpp weight name, the
// names of an imatrix file's entries.
func linearNames(src string) (map[string]string, error) {
	cfg, err := model.LoadConfig(src)
	if err != nil {
		return nil, err
	}
	if cfg.IsMoE() {
		return nil, fmt.Errorf("%s: llama.cpp's importance-matrix files hold a mixture of experts' entries per merged tensor of experts, which qpack does not read or write yet; calibrate with --calib instead", src)
	}
	names, err := ggufexport.TensorNames(cfg, func(string) bool { return false }) // no experts: names need no checkpoint
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src, err)
	}
	out := map[string]string{}
	for hf, g := range names {
		if p := model.ParseTensorName(hf); p.Role.IsLinear() && strings.HasSuffix(hf, ".weight") {
			out[p.Module] = g
		}
	}
	return out, nil
}

// readImatrixFile reads llama.cpp's importance matrix (llama-imatrix's output) as the E[x²]
// of every decoder linear of the checkpoint at src, refusing a file that lacks one or whose
// sizes differ from the model's.
func readImatrixFile(path, src string, inputs map[string]int) (map[string][]float32, error) {
	f, err := imatrix.Read(path)
	if err != nil {
		return nil, err
	}
	names, err := linearNames(src)
	if err != nil {
		return nil, err
	}
	out := map[string][]float32{}
	for module, name := range names {
		v, ok := f.Lookup(name)
		if !ok {
			return nil, fmt.Errorf("%s: no entry for %s (%s)", path, name, module)
		}
		if k, ok := inputs[module]; ok && len(v) != k {
			return nil, fmt.Errorf("%s: %s has %d values, the model's %s has %d input channels", path, name, len(v), module, k)
		}
		out[module] = v
	}
	return out, nil
}

// ImatrixOptions say how WriteImatrix measures.
type ImatrixOptions struct {
	Calib  CalibOptions
	Device string          // auto, cpu or cuda
	Log    io.Writer       // progress lines; nil discards
	Ctx    context.Context // stops the measuring between blocks
}

// WriteImatrix measures every decoder linear's E[x²] over the calibration data and writes it
// as llama.cpp's imatrix file at dst, which llama-quantize --imatrix reads: one entry per
// linear under its llama.cpp name, ncall = the calibration sequences (llama-imatrix's chunks).
func WriteImatrix(src, dst string, o ImatrixOptions) error {
	if o.Calib.File == "" {
		return fmt.Errorf("an importance matrix needs calibration data (--calib FILE)")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Ctx == nil {
		o.Ctx = context.Background()
	}
	names, err := linearNames(src)
	if err != nil {
		return err
	}
	calib, err := loadCalibration(src, o.Calib)
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(o.Log, format, args...) }
	imp, _, err := measureImportance(o.Ctx, src, calib, o.Device, nil, "", ExpertOptions{}, logf)
	if err != nil {
		return err
	}
	f := &imatrix.File{Chunks: int32(calib.Samples), Dataset: filepath.Base(o.Calib.File)}
	for module, name := range names {
		v, ok := imp[module]
		if !ok {
			return fmt.Errorf("%s: no activation statistics for %s", src, module)
		}
		f.Entries = append(f.Entries, imatrix.Entry{Name: name, Calls: int32(calib.Samples), Mean: v})
	}
	sort.Slice(f.Entries, func(i, j int) bool { return f.Entries[i].Name < f.Entries[j].Name })
	return imatrix.Write(dst, f)
}
