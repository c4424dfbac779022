// Package b3sum computes a file's BLAKE3-256 digest (what the b3sum tool prints) on several
// goroutines, each reading whole 256 KiB subtrees of the hash tree into its own buffer, so that
// the bytes are hashed from the cache rather than gathered from memory.
//
// BLAKE3 is a tree hash: every aligned run of 2^h chunks (1 KiB each) that ends before the
// input's last chunk is a subtree whose chaining value depends only on its bytes and position.
// Sum computes those of the pieces in any order and merges them as the sequential hasher
// (lukechampine.com/blake3) does, so the digest is BLAKE3's, byte for byte.
package b3sum

import (
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"lukechampine.com/blake3/guts"
)

const (
	chunkLen = guts.ChunkSize
	// simdLen is what guts.CompressBuffer hashes in one call (16 chunks on AVX-512).
	simdLen = guts.MaxSIMD * chunkLen
	// pieceHeight: a piece is 2^pieceHeight chunks, 256 KiB, read and hashed by one goroutine
	// while it stays in the core's L2 cache.
	pieceHeight = 8
	pieceLen    = chunkLen << pieceHeight
)

// Sum returns the hex BLAKE3-256 digest of the first size bytes of r, hashed on up to workers
// goroutines. stopped, polled between pieces, abandons the hashing with an error when it
// returns true.
func Sum(r io.ReaderAt, size int64, workers int, stopped func() bool) (string, error) {
	if size < 0 {
		return "", fmt.Errorf("b3sum: negative size %d", size)
	}
	chunks := max(1, (size+chunkLen-1)/chunkLen) // an empty input has one empty chunk
	pieces := (chunks - 1) >> pieceHeight        // the whole pieces before the last chunk
	cvs, err := pieceCVs(r, int(pieces), workers, stopped)
	if err != nil {
		return "", err
	}
	var t tree
	for _, cv := range cvs {
		t.push(cv, pieceHeight)
	}
	// The rest: chunks after the pieces up to the last one, then the last (1 to 1024 bytes, none
	// for an empty input), which becomes the root unless the tree holds anything else.
	rest := make([]byte, size-pieces*pieceLen, pieceLen+simdLen) // room to pad a buffer to simdLen
	if _, err := r.ReadAt(rest, pieces*pieceLen); err != nil && len(rest) > 0 {
		return "", fmt.Errorf("b3sum: reading bytes %d to %d: %w", pieces*pieceLen, size, err)
	}
	counter := uint64(pieces) << pieceHeight
	last := uint64(chunks) - 1 - counter // chunks before the last one
	for _, h := range guts.Eigentrees(counter, last) {
		n := chunkLen << h
		t.push(subtreeCV(rest[:n], counter), h)
		rest, counter = rest[n:], counter+1<<h
	}
	root := guts.CompressChunk(rest, &guts.IV, counter, 0)
	out := guts.WordsToBytes(guts.CompressNode(t.root(root)))
	return hex.EncodeToString(out[:32]), nil
}

// pieceCVs returns the chaining values of the first pieces pieces of r, hashed by up to workers
// goroutines that take pieces in turn.
func pieceCVs(r io.ReaderAt, pieces, workers int, stopped func() bool) ([][8]uint32, error) {
	cvs := make([][8]uint32, pieces)
	errs := make([]error, max(1, min(workers, pieces)))
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			buf := make([]byte, pieceLen)
			for {
				i := next.Add(1) - 1
				if i >= int64(pieces) {
					return
				}
				if stopped() {
					errs[w] = fmt.Errorf("b3sum: stopped")
					next.Store(int64(pieces))
					return
				}
				if _, err := r.ReadAt(buf, i*pieceLen); err != nil {
					errs[w] = fmt.Errorf("b3sum: reading bytes %d to %d: %w", i*pieceLen, (i+1)*pieceLen, err)
					next.Store(int64(pieces))
					return
				}
				cvs[i] = subtreeCV(buf, uint64(i)<<pieceHeight)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return cvs, nil
}

// subtreeCV is the chaining value of the subtree of 2^h whole chunks b starting at chunk
// counter. Below simdLen, b's capacity must reach simdLen: CompressBuffer takes a full buffer.
func subtreeCV(b []byte, counter uint64) [8]uint32 {
	if len(b) <= simdLen {
		return guts.ChainingValue(guts.CompressBuffer((*[simdLen]byte)(b[:simdLen]), len(b), &guts.IV, counter, 0))
	}
	half := len(b) / 2
	left, right := subtreeCV(b[:half], counter), subtreeCV(b[half:], counter+uint64(half/chunkLen))
	return guts.ChainingValue(guts.ParentNode(left, right, &guts.IV, 0))
}

// tree is the sequential hasher's stack of subtree roots, at most one per height.
type tree struct {
	stack   [64][8]uint32
	counter uint64 // chunks pushed; bit h is set when stack[h] is occupied
}

// push adds the subtree of 2^height chunks that follows those pushed, merging equal heights.
func (t *tree) push(cv [8]uint32, height int) {
	i := height
	for ; t.counter&(1<<i) != 0; i++ {
		cv = guts.ChainingValue(guts.ParentNode(t.stack[i], cv, &guts.IV, 0))
	}
	t.stack[i] = cv
	t.counter += 1 << height
}

// root merges the last chunk's node n with the stack, right to left, and flags the result as
// the root.
func (t *tree) root(n guts.Node) guts.Node {
	for i := range 64 {
		if t.counter&(1<<i) != 0 {
			n = guts.ParentNode(t.stack[i], guts.ChainingValue(n), &guts.IV, 0)
		}
	}
	n.Flags |= guts.FlagRoot
	return n
}
