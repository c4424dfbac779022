package dataset

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qpack-dev/qpack/internal/testenv"
)

func TestTextAndIdsAgree(t *testing.T) {
	tiny := testenv.Testdata(t, "models/tiny")
	ids, err := LoadIDs(filepath.Join(tiny, "heldout_ids.npy"), tiny)
	if err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(t.TempDir(), "t.txt")
	raw, _ := os.ReadFile(filepath.Join(tiny, "heldout.txt"))
	os.WriteFile(text, raw[:5000], 0o644)
	fromText, err := LoadIDs(text, tiny)
	if err != nil {
		t.Fatal(err)
	}
	if len(fromText) < 100 {
		t.Fatalf("only %d ids from 5000 characters", len(fromText))
	}
	for i := range len(fromText) - 5 { // the last ids may differ at the cut
		if fromText[i] != ids[i] {
			t.Fatalf("id %d: text gives %d, the reference %d", i, fromText[i], ids[i])
		}
	}
	if _, err := LoadIDs(text, t.TempDir()); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("text without a tokenizer should fail naming tokenizer.json, got %v", err)
	}
	if _, err := LoadIDs("", tiny); err == nil {
		t.Errorf("no file should fail")
	}
}
