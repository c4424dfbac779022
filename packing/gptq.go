package packing

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/qpack-dev/qpack/quant"
)

// GPTQ is the AutoGPTQ/GPTQModel layout (docs/reference/formats.md §1). For a module prefix P and W[N, K]:
//
//	P.qweight I32 [K·b/32, N]     codes packed along K, column n a dense bitstream (PackStream)
//	P.qzeros  I32 [ng, ⌈N·b/32⌉]  zero points packed along N, one bitstream per group
//	P.scales  F16 [ng, N]
//	P.g_idx   I32 [K]             group of each input channel (k / G without act-order)
//
// ng = ⌈K/G⌉ (1 for per-channel, written as group_size −1 in the config). K·b must be a
// multiple of 32 (K a multiple of 32/b, or of 32 for 3-bit).
//
// V2 false is checkpoint_format "gptq": the stored zero is (z − 1) mod 2^b, and readers add 1
// back. AutoGPTQ's own reader masks the sum to b bits, so z = 0 survives; vLLM's and ExLlama's
// v1 kernels do not mask and read it as 2^b — use V2 for asymmetric checkpoints meant for
// them. V2 true is "gptq_v2": the stored zero is z.
type GPTQ struct{ V2 bool }

func (GPTQ) MixedSchemes() bool { return false }

func (f GPTQ) Name() string {
	if f.V2 {
		return "gptq_v2"
	}
	return "gptq"
}

func (f GPTQ) Supports(s quant.Scheme) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := refuseKQuant(f.Name(), s); err != nil {
		return err
	}
	if s.Grid != quant.Integer || !gptqWidth(s.Bits) {
		return fmt.Errorf("format %s holds integer 2/3/4/8-bit schemes, not %s: use format qpack", f.Name(), s)
	}
	return nil
}

// gptqWidth reports whether GPTQ's loaders (AutoGPTQ, GPTQModel, vLLM) take b-bit codes.
func gptqWidth(b int) bool { return b == 2 || b == 3 || b == 4 || b == 8 }

// zeroShift is what the stored zero point is below the true one.
func (f GPTQ) zeroShift() int {
	if f.V2 {
		return 0
	}
	return 1
}

func (f GPTQ) checkShape(prefix string, s quant.Scheme, k int) error {
	if k*s.Bits%32 != 0 {
		return fmt.Errorf("tensor %s: format %s packs %d-bit codes along K in whole int32 words, so K must be a multiple of %d, not %d",
			prefix, f.Name(), s.Bits, 32/gcd(32, s.Bits), k)
	}
	return nil
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func (f GPTQ) Pack(prefix string, t *quant.Tensor) ([]Raw, error) {
	return f.PackInto(nil, prefix, t)
}

// PackInto is Pack writing into dst, the result of an earlier Pack or PackInto (or nil): the
// names, shapes and data of its Raw values are reused where large enough, so a converter that
// packs tensor after tensor allocates nothing once its buffers have grown (beyond a few words
// for goroutines when a large 4-bit tensor is packed in parallel). The result aliases dst's
// buffers.
func (f GPTQ) PackInto(dst []Raw, prefix string, t *quant.Tensor) ([]Raw, error) {
	if err := checkTensor(prefix, t); err != nil {
		return nil, err
	}
	return f.packInto(dst, prefix, t, func(qweight []byte) error { return packGPTQWeights(qweight, t) })
}

// PackRowsInto is PackInto for a quantizer that never holds all the codes at once: packRows
// quantizes the tensor a block of rows at a time, packs each block into qweight (the data of
// P.qweight) with PackGPTQRows, and sets t's Scales and Zeros. t gives the scheme and shape
// beforehand; its Codes are not read, and act-order (GIdx) is not supported.
func (f GPTQ) PackRowsInto(dst []Raw, prefix string, t *quant.Tensor, packRows func(qweight []byte) error) ([]Raw, error) {
	if t.GIdx != nil {
		return nil, fmt.Errorf("tensor %s: packing by rows does not support act-order group indices", prefix)
	}
	return f.packInto(dst, prefix, t, func(qweight []byte) error {
		if err := packRows(qweight); err != nil {
			return err
		}
		return checkParams(t)
	})
}

// packInto writes the four tensors, qweight's data by packWeights, which runs first.
func (f GPTQ) packInto(dst []Raw, prefix string, t *quant.Tensor, packWeights func(qweight []byte) error) ([]Raw, error) {
	s, n, k := t.Scheme, t.N, t.K
	if err := f.Supports(s); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	if err := f.checkShape(prefix, s, k); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("tensor %s: %d output rows", prefix, n)
	}
	ng := s.Groups(k)
	dst = growRaws(dst, 4)
	qweight := reuseRaw(&dst[0], prefix, ".qweight", "I32", k*s.Bits/32, n)
	if err := packWeights(qweight.Data); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	qzeros := reuseRaw(&dst[1], prefix, ".qzeros", "I32", ng, PackedLen[uint32](n, s.Bits))
	if err := f.packZeros(qzeros.Data, t); err != nil {
		return nil, fmt.Errorf("tensor %s zeros: %w", prefix, err)
	}
	scales := reuseRaw(&dst[2], prefix, ".scales", "F16", ng, n)
	if err := putF16Transposed(scales, t.Scales, n, ng); err != nil {
		return nil, err
	}
	gidx := reuseRaw(&dst[3], prefix, ".g_idx", "I32", k)
	for c := range k {
		binary.LittleEndian.PutUint32(gidx.Data[4*c:], uint32(t.Group(c)))
	}
	return dst, nil
}

// checkParams is the part of quant.Tensor.Validate that PackRowsInto can check once the rows
// are packed: the lengths and ranges of the scales and zero points.
func checkParams(t *quant.Tensor) error {
	groups := t.Scheme.Groups(t.K)
	ng := t.N * groups
	if len(t.Scales) != ng || len(t.Zeros) != ng {
		return fmt.Errorf("%d scales and %d zero points for %d groups", len(t.Scales), len(t.Zeros), ng)
	}
	for i, v := range t.Scales {
		if math.Float32bits(v)&0x7fffffff-1 >= 0x7f800000-1 { // ±0, ±Inf or NaN
			return fmt.Errorf("scale %g at row %d, group %d: scales must be finite and non-zero", v, i/groups, i%groups)
		}
	}
	for i, z := range t.Zeros {
		if int(z) > t.Scheme.MaxQ() {
			return fmt.Errorf("zero point %d at row %d, group %d does not fit in %d bits", z, i/groups, i%groups, t.Scheme.Bits)
		}
	}
	return nil
}

// packGPTQWeights writes qweight [K·b/32, N] from all of t's codes, a large tensor's rows on
// GOMAXPROCS goroutines (each row is a column of qweight).
func packGPTQWeights(data []byte, t *quant.Tensor) error {
	if t.Scheme.Bits == 4 {
		if err := packGPTQ4(data, t.Codes, t.N, t.K); err == nil {
			return nil
		} // else redo it the general way for the error message
	}
	return eachRows(t.N, t.K, func(r0, r1 int) error {
		return PackGPTQRows(data, t.Codes[r0*t.K:r1*t.K], t.N, t.K, t.Scheme.Bits, r0)
	})
}

// PackGPTQRows packs rows c0 … c0+len(codes)/k−1 of an n×k tensor of b-bit codes into qweight,
// the data of the GPTQ layout's I32 [K·b/32, N] (docs/reference/formats.md §1): codes holds just those rows,
// row-major. Column c of qweight holds row c of the codes as one dense bitstream along K, cut
// into blocks of 32 codes (b whole words) packed by PackStream; 4-bit codes take
// packGPTQ4Rows. Blocks of rows packed this way give the bytes of PackInto.
func PackGPTQRows(qweight []byte, codes []uint8, n, k, bits, c0 int) error {
	if err := checkBits(bits); err != nil {
		return err
	}
	if k <= 0 || k*bits%32 != 0 || len(codes)%k != 0 || c0 < 0 || c0+len(codes)/k > n || len(qweight) != 4*n*(k*bits/32) {
		return fmt.Errorf("packing: %d codes of rows from %d and %d bytes do not fit a %dx%d tensor of %d-bit GPTQ words", len(codes), c0, len(qweight), n, k, bits)
	}
	if bits == 4 && checkNibbles(packGPTQ4Rows(qweight, codes, n, k, c0)) == nil {
		return nil
	} // else redo it the general way for the error message
	var words [8]uint32
	for i := range len(codes) / k {
		c, row := c0+i, codes[i*k:(i+1)*k]
		for k0 := 0; k0 < k; k0 += 32 {
			count := min(32, k-k0)
			if err := PackStream(words[:], 1, row[k0:], 1, count, bits); err != nil {
				return fmt.Errorf("output row %d, input channels from %d: %w", c, k0, err)
			}
			r0 := k0 * bits / 32
			for j, w := range words[:count*bits/32] {
				binary.LittleEndian.PutUint32(qweight[4*((r0+j)*n+c):], w)
			}
		}
	}
	return nil
}

// unpackGPTQWords reads qweight [K·b/32, N] back into the n×k codes, in blocks of 32 codes as
// PackGPTQRows wrote them: each block's b words of a column are gathered and unpacked as one
// contiguous stream (UnpackStream's word path). Columns go 16 at a time, the 64 bytes of a word
// row that they share read once, and the columns are split over goroutines (eachRows).
func unpackGPTQWords(codes []uint8, words []uint32, n, k, bits int) error {
	const tile = 16
	return eachRows(n, k, func(c0, c1 int) error {
		var col [8]uint32
		for t0 := c0; t0 < c1; t0 += tile {
			for k0 := 0; k0 < k; k0 += 32 {
				r0, count := k0*bits/32, min(32, k-k0)
				nw := PackedLen[uint32](count, bits)
				for c := t0; c < min(t0+tile, c1); c++ {
					for j := range nw {
						col[j] = words[(r0+j)*n+c]
					}
					if err := UnpackStream(codes[c*k+k0:c*k+k0+count], 1, col[:nw], 1, count, bits); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// packGPTQ4 packs all n rows of 4-bit codes: word (r, c) holds codes 8r…8r+7 of row c. Large
// tensors are split by output rows over GOMAXPROCS goroutines. A code ≥ 16 returns an error
// without saying where.
func packGPTQ4(data, codes []byte, n, k int) error {
	workers := min(runtime.GOMAXPROCS(0), max(1, n*k/(1<<20)), n)
	if workers == 1 { // no goroutines, no allocations
		return checkNibbles(packGPTQ4Rows(data, codes, n, k, 0))
	}
	bad := make([]uint64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		c0, c1 := w*n/workers, (w+1)*n/workers
		wg.Go(func() { bad[w] = packGPTQ4Rows(data, codes[c0*k:c1*k], n, k, c0) })
	}
	wg.Wait()
	for _, x := range bad {
		if err := checkNibbles(x); err != nil {
			return err
		}
	}
	return nil
}

// checkNibbles reports an error when some byte ORed into bad is not a 4-bit code.
func checkNibbles(bad uint64) error {
	if bad&0xF0F0F0F0F0F0F0F0 != 0 {
		return fmt.Errorf("a code does not fit in 4 bits")
	}
	return nil
}

// packGPTQ4Rows packs 4-bit codes of output rows c0 … c0+len(codes)/k−1 (codes holds just
// those rows) and returns the OR of all their code bytes. Word (r, c) is codes 8r…8r+7 of row
// c, read as one little-endian uint64 and squeezed by squeeze4. With AVX2, rows go 8 at a time
// through packGPTQ4x8AVX2 (the same words, 64 codes of each row per step), which leaves the
// words past the last whole 64 codes to packGPTQ4Words.
func packGPTQ4Rows(data, codes []byte, n, k, c0 int) (bad uint64) {
	rows := len(codes) / k
	done := 0 // rows packed by the kernel
	if hasAVX2 && k >= 64 {
		for ; done+8 <= rows; done += 8 {
			bad |= packGPTQ4x8AVX2(&data[4*(c0+done)], &codes[done*k], k, n, k/64)
		}
		bad |= packGPTQ4Words(data, codes[:done*k], n, k, c0, k/64*8)
	}
	return bad | packGPTQ4Words(data, codes[done*k:], n, k, c0+done, 0)
}

// packGPTQ4Words is packGPTQ4Rows in Go for the words from word row r0 on. Rows are visited 16
// at a time so that each word row is written a 64-byte line at a time while 16 rows of codes
// are read in order.
func packGPTQ4Words(data, codes []byte, n, k, c0, r0 int) (bad uint64) {
	const tile = 16
	rows := len(codes) / k
	for t0 := 0; t0 < rows; t0 += tile {
		t1 := min(t0+tile, rows)
		for r := r0; r < k/8; r++ {
			out := data[4*(r*n+c0+t0) : 4*(r*n+c0+t1)]
			for c := t0; c < t1; c++ {
				x := binary.LittleEndian.Uint64(codes[c*k+8*r:])
				bad |= x
				binary.LittleEndian.PutUint32(out[4*(c-t0):], squeeze4(x))
			}
		}
	}
	return bad
}

// squeeze4 packs the low nibbles of the eight bytes of x (code j in byte j) into a word, code
// j at bits 4j…4j+3.
func squeeze4(x uint64) uint32 {
	x = (x | x>>4) & 0x00FF00FF00FF00FF
	x = (x | x>>8) & 0x0000FFFF0000FFFF
	x = (x | x>>16) & 0x00000000FFFFFFFF
	return uint32(x)
}

// packZeros writes qzeros [ng, ⌈N·b/32⌉]: per group, the stored zero points of all output rows
// as one dense bitstream, packed 32 at a time (32 codes fill b whole words).
func (f GPTQ) packZeros(data []byte, t *quant.Tensor) error {
	s, n := t.Scheme, t.N
	ng := s.Groups(t.K)
	zw := PackedLen[uint32](n, s.Bits)
	var stored [32]uint8
	var words [8]uint32
	for g := range ng {
		for c0 := 0; c0 < n; c0 += 32 {
			count := min(32, n-c0)
			for i := range count {
				stored[i] = uint8((int(t.Zeros[(c0+i)*ng+g]) - f.zeroShift()) & s.MaxQ())
			}
			if err := PackStream(words[:], 1, stored[:], 1, count, s.Bits); err != nil {
				return err
			}
			w0 := c0 * s.Bits / 32
			for j, w := range words[:PackedLen[uint32](count, s.Bits)] {
				binary.LittleEndian.PutUint32(data[4*(g*zw+w0+j):], w)
			}
		}
	}
	return nil
}

func (f GPTQ) Metadata(string, *quant.Tensor) map[string]string { return nil }

func (f GPTQ) Unpack(prefix string, get func(string) (Raw, bool), meta map[string]string) (*quant.Tensor, error) {
	s, err := supportedScheme(f, prefix, meta)
	if err != nil {
		return nil, err
	}
	g := getter(get)
	qw, err := g.need(prefix + ".qweight")
	if err != nil {
		return nil, err
	}
	rows, n, err := qw.matrix("I32")
	if err != nil {
		return nil, err
	}
	k := rows * 32 / s.Bits
	if rows*32%s.Bits != 0 {
		return nil, fmt.Errorf("tensor %s: %d rows of words do not hold whole %d-bit codes", qw.Name, rows, s.Bits)
	}
	var gidx []int32
	if gr, ok := get(prefix + ".g_idx"); ok { // old AutoGPTQ checkpoints may lack it
		gr.Name = prefix + ".g_idx"
		if err := gr.expect("I32", k); err != nil {
			return nil, fmt.Errorf("%w (qweight holds K = %d %d-bit codes)", err, k, s.Bits)
		}
		gidx = rawInt32s(gr)
	}
	ng := s.Groups(k)
	sc, err := g.need(prefix + ".scales")
	if err != nil {
		return nil, err
	}
	if err := sc.expect("F16", ng, n); err != nil {
		return nil, err
	}
	qz, err := g.need(prefix + ".qzeros")
	if err != nil {
		return nil, err
	}
	zw := PackedLen[uint32](n, s.Bits)
	if err := qz.expect("I32", ng, zw); err != nil {
		return nil, err
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k),
		Scales: make([]float32, n*ng), Zeros: make([]uint8, n*ng)}
	if err := unpackGPTQWords(t.Codes, rawWords(qw), n, k, s.Bits); err != nil {
		return nil, err
	}
	zwords := rawWords(qz)
	for gi := range ng {
		if err := UnpackStream(t.Zeros[gi:], ng, zwords[gi*zw:], 1, n, s.Bits); err != nil {
			return nil, err
		}
	}
	for i, z := range t.Zeros {
		t.Zeros[i] = uint8((int(z) + f.zeroShift()) & s.MaxQ())
		if s.Sym && int(t.Zeros[i]) != symZero(s) {
			return nil, fmt.Errorf("tensor %s: symmetric scheme %s but zero point %d for row %d group %d", qz.Name, s, t.Zeros[i], i/ng, i%ng)
		}
	}
	rawF16(sc, t.Scales, transposed(ng, n))
	if gidx != nil && !trivialGIdx(s, gidx) {
		if err := checkGIdx(prefix+".g_idx", gidx, k, ng); err != nil {
			return nil, err
		}
		t.GIdx = gidx
	}
	return checkUnpacked(prefix, t)
}

func (f GPTQ) Bytes(s quant.Scheme, n, k int) int64 {
	ng := int64(s.Groups(k))
	return int64(k*s.Bits/32)*int64(n)*4 + ng*int64(PackedLen[uint32](n, s.Bits))*4 + ng*int64(n)*2 + int64(k)*4
}

func (f GPTQ) TensorNames(prefix string) []string {
	return []string{prefix + ".qweight", prefix + ".qzeros", prefix + ".scales", prefix + ".g_idx"}
}
