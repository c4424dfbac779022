package awq

import (
	"fmt"
	"math"
)

// Inputs gathers, for one group of linears sharing an input, the mean |x| of every input channel
// over all calibration tokens, and a sample of the input rows on which the searches measure their
// loss. Every stride-th token (counted over all sequences) is kept; Stride 0 or 1 keeps all.
type Inputs struct {
	Cols   int
	Stride int

	absSum []float64
	tokens int
	X      []float32 // kept rows [Rows, Cols]
	Rows   int
}

// Add accumulates x [rows, cols]; a NaN or infinite activation is an error naming its channel.
func (in *Inputs) Add(x []float32, rows, cols int) error {
	if in.absSum == nil {
		in.Cols = cols
		in.absSum = make([]float64, cols)
	}
	if cols != in.Cols {
		return fmt.Errorf("awq: input has %d channels, earlier %d", cols, in.Cols)
	}
	stride := max(in.Stride, 1)
	for r := range rows {
		row := x[r*cols : (r+1)*cols]
		for c, v := range row {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("awq: non-finite activation %g in input channel %d (token %d)", v, c, in.tokens)
			}
			in.absSum[c] += math.Abs(float64(v))
		}
		if in.tokens%stride == 0 {
			in.X = append(in.X, row...)
			in.Rows++
		}
		in.tokens++
	}
	return nil
}

// Tokens is how many token rows were added.
func (in *Inputs) Tokens() int { return in.tokens }

// MeanAbs is mean |x| per input channel.
func (in *Inputs) MeanAbs() []float32 {
	m := make([]float32, in.Cols)
	for c, s := range in.absSum {
		m[c] = float32(s / float64(max(in.tokens, 1)))
	}
	return m
}

// Divide divides the kept rows' channels by s, as the folded model's inputs are.
func (in *Inputs) Divide(s []float32) {
	for i := range in.X {
		in.X[i] /= s[i%in.Cols]
	}
}
