package packing

import (
	"fmt"
	"runtime"

	"github.com/qpack-dev/qpack/internal/shares"
	"github.com/qpack-dev/qpack/quant"
)

// packRows stores an n×count array of b-bit values as the U8 tensor name [n, ⌈count·b/8⌉],
// each row one bitstream (PackStream), large arrays over several goroutines (eachRows).
func packRows(name string, v []uint8, n, count, bits int) (Raw, error) {
	rb := PackedLen[uint8](count, bits)
	data := make([]byte, n*rb)
	err := eachRows(n, count, func(r0, r1 int) error {
		for r := r0; r < r1; r++ {
			if err := PackStream(data[r*rb:(r+1)*rb], 1, v[r*count:], 1, count, bits); err != nil {
				return fmt.Errorf("tensor %s, row %d: %w", name, r, err)
			}
		}
		return nil
	})
	if err != nil {
		return Raw{}, err
	}
	return Raw{Name: name, DType: "U8", Shape: []int{n, rb}, Data: data}, nil
}

// unpackRows reads what packRows stored, checking the tensor's dtype and shape first.
func unpackRows(g getter, name string, n, count, bits int) ([]uint8, error) {
	r, err := g.need(name)
	if err != nil {
		return nil, err
	}
	rb := PackedLen[uint8](count, bits)
	if err := r.expect("U8", n, rb); err != nil {
		return nil, err
	}
	v := make([]uint8, n*count)
	err = eachRows(n, count, func(r0, r1 int) error {
		for row := r0; row < r1; row++ {
			if err := UnpackStream(v[row*count:(row+1)*count], 1, r.Data[row*rb:(row+1)*rb], 1, count, bits); err != nil {
				return err
			}
		}
		return nil
	})
	return v, err
}

// eachRows runs f over the rows [r0, r1) of an n×count array, split over GOMAXPROCS goroutines
// when the array is large (a 7B's MLP weight is 45 M codes), and returns the error of the first
// range that failed.
func eachRows(n, count int, f func(r0, r1 int) error) error {
	return shares.Runs(n, min(runtime.GOMAXPROCS(0), max(1, n*count/(1<<20)), max(n, 1)), f)
}

// packKQuant appends a k-quant tensor's parameters to out (shape and codes): d, dmin and the
// bitstreams of the sub-block scales (stored as quant.KQuantType.StoredScale) and mins.
func (QPack) packKQuant(out []Raw, prefix string, t *quant.Tensor) ([]Raw, error) {
	kt, _ := t.Scheme.KQuant()
	n, blocks, subs := t.N, t.Scheme.SuperBlocks(t.K), t.K/kt.Sub
	d, err := f16Raw(prefix+".qpack_scales", t.Scales, identity, n, blocks)
	if err != nil {
		return nil, err
	}
	stored := make([]uint8, len(t.SubScales))
	for i, sc := range t.SubScales {
		stored[i] = kt.StoredScale(sc)
	}
	sc, err := packRows(prefix+".qpack_subscales", stored, n, subs, kt.ScaleBits)
	if err != nil {
		return nil, err
	}
	out = append(out, d, sc)
	if !kt.Mins {
		return out, nil
	}
	dmin, err := f16Raw(prefix+".qpack_mins", t.Mins, identity, n, blocks)
	if err != nil {
		return nil, err
	}
	m, err := packRows(prefix+".qpack_submins", t.SubMins, n, subs, kt.ScaleBits)
	if err != nil {
		return nil, err
	}
	return append(out, dmin, m), nil
}

// unpackKQuant reads a k-quant module back (see QPack), checking every tensor's dtype and shape
// against [N, K] before it allocates, and the values with quant.Tensor.Validate.
func (QPack) unpackKQuant(g getter, prefix string, s quant.Scheme, n, k int) (*quant.Tensor, error) {
	kt, _ := s.KQuant()
	if k%kt.Sub != 0 {
		return nil, fmt.Errorf("tensor %s: K = %d is not a multiple of %s's sub-block of %d", prefix, k, s, kt.Sub)
	}
	blocks, subs := s.SuperBlocks(k), k/kt.Sub
	t := &quant.Tensor{Scheme: s, N: n, K: k}
	var err error
	if t.Codes, err = unpackRows(g, prefix+".qpack_codes", n, k, s.Bits); err != nil {
		return nil, err
	}
	if t.Scales, err = f16Matrix(g, prefix+".qpack_scales", n, blocks); err != nil {
		return nil, err
	}
	stored, err := unpackRows(g, prefix+".qpack_subscales", n, subs, kt.ScaleBits)
	if err != nil {
		return nil, err
	}
	t.SubScales = make([]int8, len(stored))
	for i, v := range stored {
		t.SubScales[i] = kt.LoadScale(v)
	}
	if kt.Mins {
		if t.Mins, err = f16Matrix(g, prefix+".qpack_mins", n, blocks); err != nil {
			return nil, err
		}
		if t.SubMins, err = unpackRows(g, prefix+".qpack_submins", n, subs, kt.ScaleBits); err != nil {
			return nil, err
		}
	}
	if _, ok := g(prefix + ".qpack_g_idx"); ok {
		return nil, fmt.Errorf("tensor %s: %s has no act-order, but %s.qpack_g_idx is stored", prefix, s, prefix)
	}
	return checkUnpacked(prefix, t)
}

// f16Matrix reads the F16 tensor name of shape [rows, cols].
func f16Matrix(g getter, name string, rows, cols int) ([]float32, error) {
	r, err := g.need(name)
	if err != nil {
		return nil, err
	}
	if err := r.expect("F16", rows, cols); err != nil {
		return nil, err
	}
	v := make([]float32, rows*cols)
	rawF16(r, v, identity)
	return v, nil
}

// kquantParamBytes is what packKQuant stores for an n×k k-quant weight: 2 bytes of d (and dmin)
// per super-block, and each row's sub-block scales (and mins) in ScaleBits bits.
func kquantParamBytes(s quant.Scheme, n, k int) int64 {
	kt, _ := s.KQuant()
	perRow := int64(2*s.SuperBlocks(k) + PackedLen[uint8](k/kt.Sub, kt.ScaleBits))
	if kt.Mins {
		perRow *= 2
	}
	return int64(n) * perRow
}
