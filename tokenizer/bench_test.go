package tokenizer

import (
	"os"
	"testing"
)

// BenchmarkEncodeCalib encodes the 600 kB calibration text with the tiny model's tokenizer. The
// BPE cache is warm after the first iteration, as it is when a long text repeats its words.
func BenchmarkEncodeCalib(b *testing.B) {
	const calib = "/work/shared/models/calib.txt"
	text, err := os.ReadFile(calib)
	if err != nil {
		b.Skipf("%s not present", calib)
	}
	tok, err := Load("../testdata/models/tiny/tokenizer.json")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(string(text))
	}
}

// BenchmarkEncodeColdCache measures the same text with a fresh tokenizer each time, so every word
// goes through BPE merging once.
func BenchmarkEncodeColdCache(b *testing.B) {
	const calib = "/work/shared/models/calib.txt"
	text, err := os.ReadFile(calib)
	if err != nil {
		b.Skipf("%s not present", calib)
	}
	data, err := os.ReadFile("../testdata/models/tiny/tokenizer.json")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		b.StopTimer()
		tok, err := FromJSON(data)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		tok.Encode(string(text))
	}
}
