package b3sum

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"lukechampine.com/blake3"
)

func never() bool { return false }

// Sum is BLAKE3 for every size around the boundaries of chunks, SIMD buffers and pieces, and
// whatever the number of workers.
func TestSumIsBLAKE3(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 5*pieceLen+3*simdLen+5*chunkLen+7)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	var sizes []int
	for _, base := range []int{0, chunkLen, 2 * chunkLen, simdLen, pieceLen, pieceLen + chunkLen, 2 * pieceLen, 3*pieceLen + simdLen + 3*chunkLen, 5 * pieceLen} {
		for _, d := range []int{-1, 0, 1, 513} {
			if s := base + d; s >= 0 {
				sizes = append(sizes, s)
			}
		}
	}
	sizes = append(sizes, len(data))
	for _, size := range sizes {
		want := blake3.Sum256(data[:size])
		for _, workers := range []int{1, 3} {
			got, err := Sum(bytes.NewReader(data[:size]), int64(size), workers, never)
			if err != nil || got != hex.EncodeToString(want[:]) {
				t.Errorf("%d bytes, %d workers: %s (%v), want %x", size, workers, got, err, want)
			}
		}
	}
}

// The published digest of no bytes.
func TestSumEmpty(t *testing.T) {
	got, err := Sum(bytes.NewReader(nil), 0, 2, never)
	if want := "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"; err != nil || got != want {
		t.Errorf("BLAKE3 of no bytes: %s (%v), want %s", got, err, want)
	}
}

// A file shorter than its stated size and a stop request are errors, not digests.
func TestSumErrors(t *testing.T) {
	data := make([]byte, 3*pieceLen)
	if _, err := Sum(bytes.NewReader(data), int64(len(data))+10, 2, never); err == nil || !strings.Contains(err.Error(), "reading") {
		t.Errorf("short input: %v", err)
	}
	if _, err := Sum(failingReader{}, 4*pieceLen, 2, never); !errors.Is(err, errDisk) {
		t.Errorf("failing reader: %v", err)
	}
	if _, err := Sum(bytes.NewReader(data), int64(len(data)), 2, func() bool { return true }); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("stopped: %v", err)
	}
}

var errDisk = errors.New("disk error")

type failingReader struct{}

func (failingReader) ReadAt([]byte, int64) (int, error) { return 0, errDisk }

// BenchmarkSum against the library's hasher fed 64 MiB writes (what convert did before), on
// 64 MiB already in memory: read into buffers through ReaderAt, as from the page cache.
func BenchmarkSum(b *testing.B) {
	data := make([]byte, 64<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	b.Run("b3sum", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := Sum(bytes.NewReader(data), int64(len(data)), runtime.GOMAXPROCS(0), never); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("library", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			h := blake3.New(32, nil)
			h.Write(data)
			h.Sum(nil)
		}
	})
}
