package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"

	"github.com/qpack-dev/qpack/dataset"
	"github.com/qpack-dev/qpack/model"
)

// CalibOptions say which calibration data to run the model on.
type CalibOptions struct {
	File    string // text (tokenized with the checkpoint's tokenizer.json) or .npy token ids
	Samples int    // sequences (default 128)
	SeqLen  int    // tokens per sequence (default 512)
}

// Calibration is the calibration data as used, recorded in the output's provenance.
type Calibration struct {
	File    string `json:"file"`
	SHA256  string `json:"sha256"`
	Samples int    `json:"samples"`
	SeqLen  int    `json:"seq_len"`
	seqs    [][]int
}

// loadCalibration tokenizes the calibration file and cuts it into Samples consecutive,
// non-overlapping sequences of SeqLen tokens (deterministic, unlike the reference's random
// windows), refusing text that is too short.
func loadCalibration(src string, o CalibOptions) (*Calibration, error) {
	c := &Calibration{File: o.File, Samples: o.Samples, SeqLen: o.SeqLen}
	if c.Samples == 0 {
		c.Samples = 128
	}
	if c.SeqLen == 0 {
		c.SeqLen = 512
	}
	raw, err := os.ReadFile(o.File)
	if err != nil {
		return nil, fmt.Errorf("calibration data: %w", err)
	}
	sum := sha256.Sum256(raw)
	c.SHA256 = hex.EncodeToString(sum[:])
	ids, err := dataset.LoadIDs(o.File, src)
	if err != nil {
		return nil, fmt.Errorf("calibration data: %w", err)
	}
	if need := c.Samples * c.SeqLen; len(ids) < need {
		return nil, fmt.Errorf("calibration data %s has %d tokens; %d samples of %d tokens need %d (lower --calib-samples or --calib-seqlen, or give more text)",
			o.File, len(ids), c.Samples, c.SeqLen, need)
	}
	for i := range c.Samples {
		c.seqs = append(c.seqs, ids[i*c.SeqLen:(i+1)*c.SeqLen])
	}
	return c, nil
}

// channelEnergy accumulates, per linear module, the mean x² of each input channel over the
// calibration tokens: the diagonal of the Hessian XᵀX/n, which weighs weight errors by how much
// each input channel carries.
type channelEnergy struct {
	sums    map[string][]float64 // "block/group" → Σ x² per channel
	abs     map[string][]float64 // "block/group" → Σ |x| per channel (AWQ's statistic)
	tokens  map[string]int
	modules map[string]string // module prefix → its "block/group"
}

func (e *channelEnergy) Observe(block int, g model.Group, x []float32, rows, cols int) error {
	key := fmt.Sprintf("%d/%s", block, g)
	s := e.sums[key]
	if s == nil {
		s = make([]float64, cols)
		e.sums[key] = s
		e.abs[key] = make([]float64, cols)
	}
	a := e.abs[key]
	for r := range rows {
		row := x[r*cols : (r+1)*cols]
		for c, v := range row {
			if v != v || v-v != 0 {
				return fmt.Errorf("block %d: non-finite activation in the input of %s", block, g)
			}
			s[c] += float64(v) * float64(v)
			a[c] += math.Abs(float64(v))
		}
	}
	e.tokens[key] += rows
	return nil
}

// Update records which modules read each observed input; the weights stay as they are.
func (e *channelEnergy) Update(b *model.Block, groups []model.Group) error {
	for _, g := range groups {
		for _, l := range b.Linears(g) {
			e.modules[l.Name] = fmt.Sprintf("%d/%s", b.Index, g)
		}
	}
	return nil
}

// importance returns mean x² per input channel for every module, by module prefix.
func (e *channelEnergy) importance() map[string][]float32 { return e.means(e.sums) }

// meanAbs returns mean |x| per input channel for every module, by module prefix.
func (e *channelEnergy) meanAbs() map[string][]float32 { return e.means(e.abs) }

func (e *channelEnergy) means(sums map[string][]float64) map[string][]float32 {
	out := map[string][]float32{}
	for module, key := range e.modules {
		s, n := sums[key], e.tokens[key]
		imp := make([]float32, len(s))
		for i, v := range s {
			imp[i] = float32(v / float64(max(n, 1)))
		}
		out[module] = imp
	}
	return out
}

// measureImportance runs the model over the calibration sequences and returns each decoder
// linear's input-channel energy (mean x²) and mean |x|.
func measureImportance(src string, c *Calibration) (energy, meanAbs map[string][]float32, err error) {
	m, err := model.Open(src)
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	e := &channelEnergy{sums: map[string][]float64{}, abs: map[string][]float64{}, tokens: map[string]int{}, modules: map[string]string{}}
	if err := model.Calibrate(m, c.seqs, e, model.CalibrateOptions{ReleaseBlocks: true}); err != nil {
		return nil, nil, err
	}
	return e.importance(), e.meanAbs(), nil
}
