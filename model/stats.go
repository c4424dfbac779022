package model

import "fmt"

// AddChannelStats adds, for every column j of x [rows, cols] (row-major), Σ_r x[r, j]² to sq[j]
// and Σ_r |x[r, j]| to abs[j] (abs may be nil). Over a linear's calibration inputs these are the
// per-input-channel statistics the quantizers weigh by: the diagonal of the Gram matrix XᵀX
// (llama.cpp's importance matrix, the allocator's activation weighting) and the mean activation
// magnitude AWQ scales by. A non-finite value is an error naming its row and column.
func AddChannelStats(sq, abs []float64, x []float32, rows, cols int) error {
	if len(x) < rows*cols || len(sq) < cols || (abs != nil && len(abs) < cols) {
		return fmt.Errorf("model: channel statistics of a %d×%d input: slices too short", rows, cols)
	}
	for r := range rows {
		row := x[r*cols : (r+1)*cols]
		for j, v := range row {
			if v != v || v-v != 0 {
				return fmt.Errorf("non-finite activation %v at row %d, channel %d", v, r, j)
			}
			d := float64(v)
			sq[j] += d * d
		}
		if abs != nil {
			for j, v := range row {
				if v < 0 {
					v = -v
				}
				abs[j] += float64(v)
			}
		}
	}
	return nil
}
