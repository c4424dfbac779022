// Package dataset loads the token ids that calibration and evaluation run on: .npy arrays as
// they are, text through the checkpoint's own tokenizer.
package dataset

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/qpack-dev/qpack/npy"
	"github.com/qpack-dev/qpack/tokenizer"
)

// LoadIDs reads token ids: an .npy array of integers as they are, anything else as UTF-8 text
// tokenized with the tokenizer.json of modelDir (no special tokens added).
func LoadIDs(path, modelDir string) ([]int, error) {
	return LoadIDsWith(path, func() (*tokenizer.Tokenizer, error) {
		return tokenizer.Load(filepath.Join(modelDir, "tokenizer.json"))
	})
}

// LoadIDsWith is LoadIDs with the tokenizer of text data given by tok, which is called only
// for text.
func LoadIDsWith(path string, tok func() (*tokenizer.Tokenizer, error)) ([]int, error) {
	if path == "" {
		return nil, fmt.Errorf("no data file given (--data)")
	}
	if strings.HasSuffix(path, ".npy") {
		a, err := npy.ReadFile(path)
		if err != nil {
			return nil, err
		}
		ids, err := a.Ints()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return ids, nil
	}
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := tok()
	if err != nil {
		return nil, fmt.Errorf("tokenizing %s: %w", path, err)
	}
	return t.Encode(string(text)), nil
}
