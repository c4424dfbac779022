package convert

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/qpack-dev/qpack/safetensors"
)

// CheckOwnOutput refuses to replace an existing output that qpack did not write (a batch
// overwrites only its own earlier results).
func CheckOwnOutput(dst string) error {
	if _, err := os.Stat(dst); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if _, err := ReadProvenance(dst); err != nil {
		return fmt.Errorf("%s exists and is not a finished qpack output (%v); remove it or choose another output", dst, err)
	}
	return nil
}

// NoOutputYet is UpToDate's reason when there is no output.
const NoOutputYet = "no output yet"

// UpToDate reports whether dst already holds what Convert(src, dst, opt) would write: its
// recorded provenance — qpack version, method, format, options, calibration data, the inputs'
// digests and the plan — equals what this conversion would record. reason says what differs.
// Deciding costs a plan (with calibration, one statistics pass) and hashing the inputs.
func UpToDate(src, dst string, opt Options) (ok bool, reason string, err error) {
	if _, err := os.Stat(dst); errors.Is(err, os.ErrNotExist) {
		return false, NoOutputYet, nil
	}
	recorded, err := ReadProvenance(dst)
	if err != nil {
		return false, fmt.Sprintf("the output's provenance cannot be read (%v)", err), nil
	}
	want, err := wouldRecord(src, opt)
	if err != nil {
		return false, "", err
	}
	for _, field := range []struct {
		name       string
		have, want any
	}{
		{"qpack version", recorded.Version, want.Version}, {"method", recorded.Method, want.Method},
		{"format", recorded.Format, want.Format}, {"options", recorded.Options, want.Options},
		{"calibration data", recorded.Calibration, want.Calibration}, {"inputs", recorded.Inputs, want.Inputs},
		{"plan", recorded.Plan, want.Plan},
	} {
		same, err := sameJSON(field.have, field.want)
		if err != nil {
			return false, "", err
		}
		if !same {
			return false, "the " + field.name + " differ from the output's", nil
		}
	}
	return true, "the output's provenance matches", nil
}

// wouldRecord is the provenance Convert(src, _, opt) would record, made without converting.
func wouldRecord(src string, opt Options) (*Provenance, error) {
	f, err := opt.validate()
	if err != nil {
		return nil, err
	}
	ck, err := safetensors.Open(src)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	calib, err := opt.calibration(ck.Dir)
	if err != nil {
		return nil, err
	}
	plan, err := makePlan(ck, opt, f, calib)
	if err != nil {
		return nil, err
	}
	hashes, err := startHashing(ck.Files(), opt.InputHash)
	if err != nil {
		return nil, err
	}
	inputs, err := hashes.wait()
	if err != nil {
		return nil, err
	}
	p := provenance(plan, calib, inputs, f, opt)
	return &p, nil
}

// sameJSON compares two values as the JSON they would be recorded as, so that a value read
// back from a file (numbers as float64) equals the one it was written from.
func sameJSON(a, b any) (bool, error) {
	ja, err := json.Marshal(a)
	if err != nil {
		return false, err
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return false, err
	}
	var va, vb any
	if err := json.Unmarshal(ja, &va); err != nil {
		return false, err
	}
	if err := json.Unmarshal(jb, &vb); err != nil {
		return false, err
	}
	ja, _ = json.Marshal(va) // maps marshal with sorted keys: a canonical form
	jb, _ = json.Marshal(vb)
	return bytes.Equal(ja, jb), nil
}
