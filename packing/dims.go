package packing

import "fmt"

// Dims of each layout: where [N, K] can be read without decoding the weights.

// Dims: qweight is [K·b/32, N] and g_idx, always written, has K entries.
func (GPTQ) Dims(prefix string, get func(string) (Raw, bool)) (n, k int, err error) {
	g := getter(get)
	qw, err := g.need(prefix + ".qweight")
	if err != nil {
		return 0, 0, err
	}
	gi, err := g.need(prefix + ".g_idx")
	if err != nil {
		return 0, 0, err
	}
	if len(qw.Shape) != 2 || len(gi.Shape) != 1 {
		return 0, 0, fmt.Errorf("tensor %s: qweight %v and g_idx %v are not a matrix and a vector", prefix, qw.Shape, gi.Shape)
	}
	return qw.Shape[1], gi.Shape[0], nil
}

// Dims: qweight is [K, N/8].
func (AWQ) Dims(prefix string, get func(string) (Raw, bool)) (n, k int, err error) {
	qw, err := getter(get).need(prefix + ".qweight")
	if err != nil {
		return 0, 0, err
	}
	if len(qw.Shape) != 2 {
		return 0, 0, fmt.Errorf("tensor %s.qweight: shape %v, want a matrix", prefix, qw.Shape)
	}
	return 8 * qw.Shape[1], qw.Shape[0], nil
}

// Dims: weight_shape holds [N, K]; the FP4 layouts have none, and their weight_packed is a U8
// [N, K/2].
func (CompressedTensors) Dims(prefix string, get func(string) (Raw, bool)) (n, k int, err error) {
	g := getter(get)
	if r, ok := get(prefix + ".weight_shape"); ok {
		r.Name = prefix + ".weight_shape"
		return rawShape(r)
	}
	wp, err := g.need(prefix + ".weight_packed")
	if err != nil {
		return 0, 0, err
	}
	rows, cols, err := wp.matrix("U8")
	if err != nil {
		return 0, 0, fmt.Errorf("%w (without %s.weight_shape, only an FP4 weight_packed gives the shape)", err, prefix)
	}
	return rows, 2 * cols, nil
}

// Dims: qpack_shape holds [N, K].
func (QPack) Dims(prefix string, get func(string) (Raw, bool)) (n, k int, err error) {
	r, err := getter(get).need(prefix + ".qpack_shape")
	if err != nil {
		return 0, 0, err
	}
	return rawShape(r)
}
