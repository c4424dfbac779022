package convert

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"github.com/qpack-dev/qpack/gguf"
	"github.com/qpack-dev/qpack/ggufexport"
	"github.com/qpack-dev/qpack/safetensors"
)

// UpToDate says why the checkpoint at dst is what converting src with opt would write now —
// the same qpack version, method, format, input files (by the digest dst recorded), calibration
// and plan — or returns "" when it is not (or does not exist).
func UpToDate(src, dst string, opt Options) (string, error) {
	f, err := opt.check()
	if err != nil {
		return "", err
	}
	p, err := ReadProvenance(dst)
	if err != nil {
		return "", nil // no output (or none complete, or not qpack's): convert
	}
	prov := *p
	if prov.Version != opt.Version || prov.Method != opt.Method.String() || prov.Format != f.Name() || prov.Options["clip"] != opt.Clip {
		return "", nil
	}
	ck, err := safetensors.Open(src)
	if err != nil {
		return "", err
	}
	defer ck.Close()
	algo := opt.InputHash
	if recorded := hashOf(prov.Inputs); recorded != algo || algo == HashNone {
		return "", nil // digests of another kind, or none: nothing to compare the inputs by
	}
	hashes, err := startHashing(ck.Files(), algo)
	if err != nil {
		return "", err
	}
	inputs, err := hashes.wait()
	if err != nil {
		return "", err
	}
	if !slices.Equal(inputs, prov.Inputs) {
		return "", nil
	}
	if err := opt.loadImatrixFile(ck); err != nil {
		return "", err
	}
	if isGGUF(f) {
		if opt.gguf, err = prepareGGUF(ck, &opt); err != nil {
			return "", err
		}
	}
	calib, err := opt.calibration(ck.Dir)
	if err != nil {
		return "", err
	}
	if !sameCalibration(calib, prov.Calibration) {
		return "", nil
	}
	plan, err := makePlan(ck, opt, f, calib)
	if err != nil {
		return "", err
	}
	now, err1 := json.Marshal(plan)
	then, err2 := json.Marshal(prov.Plan)
	if err := errors.Join(err1, err2); err != nil {
		return "", err
	}
	if !bytes.Equal(now, then) {
		return "", nil
	}
	return fmt.Sprintf("qpack %s, %s, %s, same %s of the inputs, same plan", prov.Version, prov.Method, prov.Format, algo), nil
}

// ReadProvenance reads the provenance qpack recorded in an output: a checkpoint directory's
// safetensors metadata, or a GGUF file's qpack.provenance.
func ReadProvenance(path string) (*Provenance, error) {
	var raw string
	if ggufexport.IsGGUF(path) {
		f, err := gguf.Open(path)
		if err != nil {
			return nil, err
		}
		v, _ := f.Get(ProvenanceKey)
		f.Close()
		raw, _ = v.(string)
	} else {
		out, err := safetensors.Open(path)
		if err != nil {
			return nil, err
		}
		raw = out.Metadata()[ProvenanceKey]
		out.Close()
	}
	var prov Provenance
	if raw == "" {
		return nil, fmt.Errorf("%s: no qpack provenance", path)
	}
	if err := json.Unmarshal([]byte(raw), &prov); err != nil {
		return nil, fmt.Errorf("%s: provenance: %w", path, err)
	}
	return &prov, nil
}

// hashOf says which digest the recorded inputs carry.
func hashOf(inputs []InputFile) string {
	if len(inputs) == 0 {
		return HashNone
	}
	switch {
	case inputs[0].BLAKE3 != "":
		return HashBLAKE3
	case inputs[0].SHA256 != "":
		return HashSHA256
	}
	return HashNone
}

func sameCalibration(a, b *Calibration) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.File == b.File && a.SHA256 == b.SHA256 && a.Samples == b.Samples && a.SeqLen == b.SeqLen
}

// CalibrationCache shares loaded, tokenized calibration data between conversions (a batch's
// jobs, and a job's up-to-date check and conversion): one load per source directory and
// setting. Set it in Options.Calibrations.
type CalibrationCache struct {
	mu sync.Mutex
	m  map[string]*calibEntry
}

// NewCalibrationCache returns an empty cache.
func NewCalibrationCache() *CalibrationCache {
	return &CalibrationCache{m: map[string]*calibEntry{}}
}

type calibEntry struct {
	once  sync.Once
	calib *Calibration
	err   error
}

func (c *CalibrationCache) load(src string, o CalibOptions) (*Calibration, error) {
	abs, err := filepath.Abs(src)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("%s\x00%s\x00%d\x00%d", abs, o.File, o.Samples, o.SeqLen)
	c.mu.Lock()
	e := c.m[key]
	if e == nil {
		e = &calibEntry{}
		c.m[key] = e
	}
	c.mu.Unlock()
	e.once.Do(func() { e.calib, e.err = loadCalibration(src, o) })
	return e.calib, e.err
}
