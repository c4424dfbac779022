package ggufexport

import (
	"reflect"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/gguf"
)

func TestRowChecksAndPermutation(t *testing.T) {
	err := checkRows(role{hf: "model.layers.0.mlp.down_proj.weight"}, []int{10, 48}, gguf.Q8_0)
	if err == nil || !strings.Contains(err.Error(), "model.layers.0.mlp.down_proj.weight: rows of 48 values are not whole Q8_0 blocks of 32") {
		t.Fatalf("got %v", err)
	}
	if !reflect.DeepEqual(permuteRows(8, 2), []int{0, 2, 1, 3, 4, 6, 5, 7}) {
		t.Fatalf("permuteRows(8, 2) = %v", permuteRows(8, 2))
	}
}
