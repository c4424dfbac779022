package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/cuda"
	"github.com/qpack-dev/qpack/internal/timeline"
	"github.com/qpack-dev/qpack/safetensors"
)

// DeviceBatch is the hidden states [S, T, Hidden] of S sequences of T tokens on the GPU.
type DeviceBatch struct {
	X    cuda.DevicePtr
	S, T int
	e    *GPU
}

// Free releases the hidden states.
func (x *DeviceBatch) Free() error {
	if x.X == 0 {
		return nil
	}
	err := x.e.dev.Free(x.X)
	x.X = 0
	return err
}

// gpuLinear is a Linear's weights on the GPU.
type gpuLinear struct {
	name    string
	out, in int
	w, bias cuda.DevicePtr // bias is 0 when the module has none
	wb      cuda.DevicePtr // w in 16 bits for GPUOptions.BF16's or F16's GEMMs; 0 otherwise
	shift   cuda.DevicePtr // with F16: the int32 power of two wb was scaled by
}

// gpuBlock is a decoder block's weights on the GPU, in one allocation.
type gpuBlock struct {
	b                          *Block
	mem                        cuda.DevicePtr
	memHalf                    cuda.DevicePtr // the linears' wb and shifts (GPUOptions.BF16, F16), 0 otherwise
	memSize, halfSize          int            // their sizes (allocBlock)
	rawBytes                   int            // the rawArea its BF16 and F16 weights take when uploaded
	inNorm, postNorm           cuda.DevicePtr
	qNorm, kNorm               cuda.DevicePtr         // qwen3 only
	q, k, v, o, gate, up, down *gpuLinear             // gate, up, down are nil in a mixture-of-experts block
	lin                        map[*Linear]*gpuLinear // every linear of the block (the experts' too)
	parts                      []blockPart            // where each of the block's tensors is (placeBlock)
	deviceCurrent              bool                   // the Update in progress changed this copy as the host's (KeepDeviceWeights)
}

// uploadBlock copies b's current weights to the GPU.
func (e *GPU) uploadBlock(b *Block) (*gpuBlock, error) {
	g, err := e.placeBlock(b)
	if err != nil {
		return nil, err
	}
	if err := e.rawArea.upload(e.dev, e.stager, e.stream, g, g.parts); err != nil {
		e.dev.Free(g.mem)
		return nil, fmt.Errorf("model: block %d weights on the GPU: %w", b.Index, err)
	}
	b.releaseRaw()
	if err := e.finishBlock(g); err != nil {
		return nil, err
	}
	return g, nil
}

// blockPart is one tensor of a block (or a piece of one) and where it goes on the GPU, as
// float32 values or as a linear's weight in the checkpoint's encoding (Model.SetRawLinears).
type blockPart struct {
	at    cuda.DevicePtr
	data  []float32
	raw   rawWeight // when data is nil
	rawAt int       // BF16 and F16 weights: where their bytes go in the uploading stream's rawArea
}

// len is how many values the part holds.
func (p blockPart) len() int {
	if p.raw.data == nil {
		return len(p.data)
	}
	return len(p.raw.data) / (p.raw.dtype.Bits() / 8)
}

// slice is the part's values [a, b).
func (p blockPart) slice(a, b int) blockPart {
	if p.raw.data == nil {
		return blockPart{at: p.at.Add(4 * a), data: p.data[a:b]}
	}
	w := p.raw.dtype.Bits() / 8
	return blockPart{at: p.at.Add(4 * a), raw: rawWeight{p.raw.data[w*a : w*b], p.raw.dtype}, rawAt: p.rawAt + w*a}
}

// widened says whether the part's bytes are widened on the GPU (BF16 and F16 weights).
func (p blockPart) widened() bool { return p.raw.widened() }

// widened says whether the weight's bytes are widened on the GPU (BF16 and F16, not F32).
func (r rawWeight) widened() bool { return r.data != nil && r.dtype != safetensors.F32 }

// rawArea is where a stream's uploads put a block's BF16 and F16 weights on the GPU before
// widening them into place (cuda.Device.ConvertToF32Checked), each at the same offset on every GPU
// (blockPart.rawAt): on several GPUs each copies the others' shares of those bytes from their
// areas, half the bytes of the widened values. The engine's stream has one, its uploads ahead
// another.
type rawArea struct {
	buf   cuda.DeviceBuffer
	first cuda.DeviceBuffer // the first non-finite value widened since upload began (ConvertToF32Checked)
}

// ensure makes the area hold bytes, after the work queued on stream (which may read it).
func (r *rawArea) ensure(dev *cuda.Device, stream cuda.Stream, bytes int) error {
	if bytes <= r.buf.Size {
		return nil
	}
	if err := dev.SynchronizeStream(stream); err != nil {
		return err
	}
	return dev.Grow(&r.buf, bytes)
}

// upload queues on stream the copies of parts (of block g) to the GPU through st: float32
// values (and F32 weights) as they are, BF16 and F16 weights into the area and widened from
// there, checked finite on the way (the host does not read them), which with such weights it
// waits for (checkFinite).
func (r *rawArea) upload(dev *cuda.Device, st *cuda.Stager, stream cuda.Stream, g *gpuBlock, parts []blockPart) error {
	if err := r.ensure(dev, stream, g.rawBytes); err != nil {
		return err
	}
	if g.rawBytes > 0 {
		if err := dev.Grow(&r.first, 8); err != nil {
			return err
		}
		if err := dev.Fill32Async(r.first.Ptr, math.MaxUint32, 2, stream); err != nil {
			return err
		}
	}
	for _, p := range parts {
		var err error
		switch {
		case p.widened():
			if err = st.CopyToDevice(r.at(p), p.raw.data, stream); err == nil {
				err = dev.ConvertToF32Checked(p.at, r.at(p), widenedType[p.raw.dtype], p.len(), r.first.Ptr, uint64(p.at-g.mem)/4, stream)
			}
		case p.raw.data != nil:
			err = st.CopyToDevice(p.at, p.raw.data, stream)
		default:
			err = st.CopyToDevice(p.at, cuda.Bytes(p.data), stream)
		}
		if err != nil {
			return err
		}
	}
	if g.rawBytes == 0 {
		return nil
	}
	return r.checkFinite(st, stream, g)
}

// checkFinite waits for the uploads queued on stream and returns an error naming the weight of
// g that holds the first non-finite value they widened, if any.
func (r *rawArea) checkFinite(st *cuda.Stager, stream cuda.Stream, g *gpuBlock) error {
	var first [1]uint64
	if err := st.CopyFromDevice(cuda.Bytes(first[:]), r.first.Ptr, stream); err != nil {
		return err
	}
	if first[0] == math.MaxUint64 {
		return nil
	}
	at := g.mem.Add(4 * int(first[0]))
	for l, d := range g.lin {
		if n := l.Out * l.In; d.w <= at && at < d.w.Add(4*n) {
			return fmt.Errorf("model: tensor %q has a non-finite value at index %d", l.Name+".weight", int(at-d.w)/4)
		}
	}
	return fmt.Errorf("model: block %d: a non-finite weight at byte %d of its upload", g.b.Index, 4*first[0])
}

// at is where p's bytes are in the area.
func (r *rawArea) at(p blockPart) cuda.DevicePtr { return r.buf.Ptr.Add(p.rawAt) }

// widen queues on stream the widening of p's bytes in the area into float32 at dst.
func (r *rawArea) widen(dev *cuda.Device, stream cuda.Stream, dst cuda.DevicePtr, p blockPart) error {
	return dev.ConvertToF32(dst, r.at(p), widenedType[p.raw.dtype], p.len(), stream)
}

// widenedType is the cuda package's name of each 16-bit checkpoint type.
var widenedType = map[safetensors.DType]cuda.DType{safetensors.BF16: cuda.BF16, safetensors.F16: cuda.F16}

// free releases the area.
func (r *rawArea) free(dev *cuda.Device) {
	for _, b := range []*cuda.DeviceBuffer{&r.buf, &r.first} {
		if b.Size > 0 {
			dev.Free(b.Ptr)
			*b = cuda.DeviceBuffer{}
		}
	}
}

// placeBlock lays b's tensors out in one allocation (g.parts says where each goes) for the
// caller to copy them there.
func (e *GPU) placeBlock(b *Block) (*gpuBlock, error) {
	type part struct {
		dst *cuda.DevicePtr
		blockPart
	}
	g := &gpuBlock{b: b, lin: map[*Linear]*gpuLinear{}}
	values := func(dst *cuda.DevicePtr, v []float32) part { return part{dst, blockPart{data: v}} }
	parts := []part{values(&g.inNorm, b.InputNorm), values(&g.postNorm, b.PostAttnNorm)}
	if e.cfg.QKNorm {
		parts = append(parts, values(&g.qNorm, b.QNorm), values(&g.kNorm, b.KNorm))
	}
	for _, l := range b.AllLinears() {
		d := &gpuLinear{name: l.Name, out: l.Out, in: l.In}
		g.lin[l] = d
		parts = append(parts, part{&d.w, blockPart{data: l.W, raw: l.raw}})
		if l.Bias != nil {
			parts = append(parts, values(&d.bias, l.Bias))
		}
	}
	g.q, g.k, g.v, g.o = g.lin[b.Q], g.lin[b.K], g.lin[b.V], g.lin[b.O]
	if b.MoE == nil {
		g.gate, g.up, g.down = g.lin[b.Gate], g.lin[b.Up], g.lin[b.Down]
	}
	const align = 256
	offsets, total := make([]int, len(parts)), 0
	for i, p := range parts {
		offsets[i] = total
		total += (4*p.len() + align - 1) / align * align
	}
	var err error
	if g.mem, err = e.allocBlock(total); err != nil {
		return nil, fmt.Errorf("model: block %d weights on the GPU: %w", b.Index, err)
	}
	g.memSize = total
	g.parts = make([]blockPart, len(parts))
	for i, p := range parts {
		*p.dst = g.mem.Add(offsets[i])
		g.parts[i] = p.blockPart
		g.parts[i].at = *p.dst
		if p.widened() {
			g.parts[i].rawAt = g.rawBytes
			g.rawBytes += (len(p.raw.data) + align - 1) / align * align
		}
	}
	return g, nil
}

// finishBlock rounds the linears of g, whose weights are in place, to 16 bits when the GEMMs
// read them so; on failure g is freed.
func (e *GPU) finishBlock(g *gpuBlock) error {
	if e.linears == noHalf {
		return nil
	}
	if err := e.roundBlockToHalf(g); err != nil {
		e.freeBlock(g)
		return fmt.Errorf("model: block %d weights on the GPU: %w", g.b.Index, err)
	}
	return nil
}

// roundBlockToHalf gives every linear of g but a router (whose choices 16 bits would move) its
// weights in 16 bits (and with F16 their shifts), in one allocation.
func (e *GPU) roundBlockToHalf(g *gpuBlock) error {
	const align = 256
	var lins []*gpuLinear
	total := 0
	for l, d := range g.lin {
		if g.b.MoE != nil && l == g.b.MoE.Router {
			continue
		}
		lins = append(lins, d)
		total += (2*d.out*d.in + align - 1) / align * align
	}
	shifts := total
	total += 4 * len(lins)
	var err error
	g.halfSize = max(total, align)
	if g.memHalf, err = e.allocBlock(g.halfSize); err != nil {
		return err
	}
	at := 0
	for i, d := range lins {
		d.wb = g.memHalf.Add(at)
		at += (2*d.out*d.in + align - 1) / align * align
		if e.linears == halfF16 {
			d.shift = g.memHalf.Add(shifts + 4*i)
		}
		if err := e.roundLinear(d); err != nil {
			return err
		}
	}
	return nil
}

// roundLinear queues d's weights in 16 bits into d.wb.
func (e *GPU) roundLinear(d *gpuLinear) error {
	if e.linears == halfF16 {
		return e.toF16Scaled(d.wb, d.w, d.out*d.in, 0, d.shift, 0)
	}
	return e.toBF16(d.wb, d.w, d.out*d.in)
}

// refreshWeights uploads again what an Update may have changed (changeable).
func (e *GPU) refreshWeights(g *gpuBlock, groups []Group) error {
	if err := e.Synchronize(); err != nil { // the observing passes are done with the old weights
		return err
	}
	err := g.changeable(groups, func(dst cuda.DevicePtr, v []float32, name string) error {
		if err := e.stager.CopyToDevice(dst, cuda.Bytes(v), e.stream); err != nil {
			return fmt.Errorf("model: %s on the GPU: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return e.roundChanged(g, groups)
}

// changeable calls f with each part of g that an Update of the groups may change and the host
// values it holds: the weights of the groups' linears (Linear.SetWeight keeps their shapes) and,
// as AWQ folds scales into them, the two norms and the linears' biases.
func (g *gpuBlock) changeable(groups []Group, f func(dst cuda.DevicePtr, v []float32, name string) error) error {
	if err := f(g.inNorm, g.b.InputNorm, "input norm"); err != nil {
		return err
	}
	if err := f(g.postNorm, g.b.PostAttnNorm, "post-attention norm"); err != nil {
		return err
	}
	for _, gr := range groups {
		for _, l := range g.b.Linears(gr) {
			d := g.lin[l]
			if err := f(d.w, l.W, l.Name+" weights"); err != nil {
				return err
			}
			if l.Bias != nil {
				if err := f(d.bias, l.Bias, l.Name+" bias"); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// roundChanged rounds the groups' new weights to 16 bits where the GEMMs read them so.
func (e *GPU) roundChanged(g *gpuBlock, groups []Group) error {
	for _, gr := range groups {
		for _, l := range g.b.Linears(gr) {
			if d := g.lin[l]; d.wb != 0 {
				if err := e.roundLinear(d); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// freeBlock gives back g's device memory, kept as spares for later blocks (releaseBlock).
func (e *GPU) freeBlock(g *gpuBlock) error {
	return errors.Join(e.releaseBlock(g.memHalf, g.halfSize), e.releaseBlock(g.mem, g.memSize))
}

// GPUHook, when non-nil, receives the input x [rows, cols] (device memory, row-major) of each
// linear group while a block runs on a chunk of sequences; work it queues on the engine's stream
// runs before x is overwritten. An error stops the pass.
type GPUHook func(g Group, x cuda.DevicePtr, rows, cols int) error

// chunkSequences is how many sequences of T tokens one pass of a block handles at once: about
// chunkRows (8192) tokens, so the GEMMs are large, with at most 2 GiB of attention scores.
func (e *GPU) chunkSequences(S, T int) int {
	const scoreBytes = 2 << 30
	c := max(1, e.chunkRows/T)
	c = min(c, max(1, scoreBytes/(4*e.cfg.Heads*T*T)))
	return min(c, S)
}

// forwardBlock runs block g on every sequence of x, in place, chunk by chunk.
func (e *GPU) forwardBlock(g *gpuBlock, x *DeviceBatch, hook GPUHook) error {
	chunk := e.chunkSequences(x.S, x.T)
	rowBytes := 4 * x.T * e.cfg.Hidden
	for s := 0; s < x.S; s += chunk {
		n := min(chunk, x.S-s)
		if err := e.forwardChunk(g, x.X.Add(s*rowBytes), n, x.T, hook); err != nil {
			return err
		}
	}
	return e.sampleMemory()
}

// forwardChunk is Block.Forward on S sequences of T tokens at x [S, T, Hidden].
func (e *GPU) forwardChunk(g *gpuBlock, x cuda.DevicePtr, S, T int, hook GPUHook) error {
	c, rows := e.cfg, S*T
	h, err := e.floats("h", rows*c.Hidden)
	if err != nil {
		return err
	}
	out, err := e.floats("out", rows*c.Hidden)
	if err != nil {
		return err
	}
	if err := e.rmsNorm(h, x, g.inNorm, rows, c.Hidden); err != nil {
		return err
	}
	if err := e.attention(out, h, g, S, T, hook); err != nil {
		return err
	}
	if err := e.elementwise(e.fn.add, rows*c.Hidden, x, out, int64(rows*c.Hidden)); err != nil {
		return err
	}
	if err := e.rmsNorm(h, x, g.postNorm, rows, c.Hidden); err != nil {
		return err
	}
	if err := e.mlp(out, h, g, rows, hook); err != nil {
		return err
	}
	return e.elementwise(e.fn.add, rows*c.Hidden, x, out, int64(rows*c.Hidden))
}

// attention is Block.Attention on S sequences: projections, rotary into a head-major layout,
// then the products and softmax in one fused kernel (flashAttention, with FP16 GEMMs and a head
// size of 64 or 128) or through the scores (bandedAttention).
func (e *GPU) attention(out, h cuda.DevicePtr, g *gpuBlock, S, T int, hook GPUHook) error {
	c, rows := e.cfg, S*T
	D := c.HeadDim
	if err := callGPUHook(hook, GroupQKV, h, rows, c.Hidden); err != nil {
		return err
	}
	names := []string{"q", "k", "v", "qh", "kh", "vh"}
	widths := []int{c.Heads, c.KVHeads, c.KVHeads, c.Heads, c.KVHeads, c.KVHeads}
	bufs := make([]cuda.DevicePtr, len(names))
	for i := range names {
		var err error
		if bufs[i], err = e.floats(names[i], rows*widths[i]*D); err != nil {
			return err
		}
	}
	q, k, v, qh, kh, vh := bufs[0], bufs[1], bufs[2], bufs[3], bufs[4], bufs[5]
	err := e.readSame(h, rows*c.Hidden, func() error {
		for _, p := range []struct {
			y cuda.DevicePtr
			l *gpuLinear
		}{{q, g.q}, {k, g.k}, {v, g.v}} {
			if err := e.linear(p.y, h, p.l, rows); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if c.QKNorm {
		if err := e.rmsNorm(q, q, g.qNorm, rows*c.Heads, D); err != nil {
			return err
		}
		if err := e.rmsNorm(k, k, g.kNorm, rows*c.KVHeads, D); err != nil {
			return err
		}
	}
	cos, sin, err := e.ropeTables(T)
	if err != nil {
		return err
	}
	for _, p := range []struct {
		src, dst cuda.DevicePtr
		heads    int
		rotate   int32
	}{{q, qh, c.Heads, 1}, {k, kh, c.KVHeads, 1}, {v, vh, c.KVHeads, 0}} {
		err := e.fn.ropeHeads.Launch(cuda.Dim3{X: rows * p.heads, Y: 1, Z: 1}, cuda.Dim3{X: D / 2, Y: 1, Z: 1}, 0, e.stream,
			p.src, p.dst, cos, sin, int32(T), int32(p.heads), int32(D), p.rotate)
		if err != nil {
			return err
		}
	}
	// The head outputs reuse qh.
	if e.fused {
		err = e.flashAttention(qh, kh, vh, S, T, c.SlidingWindow[g.b.Index])
	} else {
		err = e.bandedAttention(qh, kh, vh, S, T, c.SlidingWindow[g.b.Index])
	}
	if err != nil {
		return err
	}
	a := q // q is free again: the merged attention output [rows, Heads·D]
	if err := e.fn.mergeHeads.Launch(cuda.Dim3{X: rows * c.Heads, Y: 1, Z: 1}, cuda.Dim3{X: D, Y: 1, Z: 1}, 0, e.stream,
		qh, a, int32(T), int32(c.Heads), int32(D)); err != nil {
		return err
	}
	if err := callGPUHook(hook, GroupO, a, rows, c.Heads*D); err != nil {
		return err
	}
	return e.linear(out, a, g.o, rows)
}

// bandedAttention is attention's products and softmax through the T×T scores: per band of
// query positions (queryBand) and query head, one batched GEMM for the scores of every sequence
// and key/value head, the causal softmax, and one batched GEMM for their outputs, into qh.
func (e *GPU) bandedAttention(qh, kh, vh cuda.DevicePtr, S, T, window int) error {
	scores, err := e.floats("scores", S*e.cfg.Heads*T*T)
	if err != nil {
		return err
	}
	band := e.queryBand(T)
	if err := e.attentionProducts(scores, qh, kh, S, T, band, false); err != nil {
		return err
	}
	if err := e.rowwise(e.fn.causalSoftmax, S*e.cfg.Heads*T, scores, int32(T), int32(window), int32(band)); err != nil {
		return err
	}
	return e.attentionProducts(scores, qh, vh, S, T, band, true)
}

// flashAttention is bandedAttention in one kernel (kernels/model.cu flash_attention_d64/128):
// queries, keys and values scaled to FP16 (ToF16Scaled), their products on the tensor cores,
// the softmax folded in tile by tile, no scores in memory; the outputs go into qh.
func (e *GPU) flashAttention(qh, kh, vh cuda.DevicePtr, S, T, window int) error {
	c := e.cfg
	nq, nkv := S*c.Heads*T*c.HeadDim, S*c.KVHeads*T*c.HeadDim
	var half [3]cuda.DevicePtr
	for i, n := range []int{nq, nkv, nkv} {
		var err error
		if half[i], err = e.work([]string{"flash.q", "flash.k", "flash.v"}[i], 2*n); err != nil {
			return err
		}
	}
	// alpha_qk = 2^−(q's shift + k's), alpha_v = 2^−(v's shift + 0)
	err := e.toF16Scaled(half[0], qh, nq, 0, e.scalar(f16QueryShift), 0)
	if err == nil {
		err = e.toF16Scaled(half[1], kh, nkv, e.scalar(f16QueryShift), 0, e.scalar(f16AlphaQK))
	}
	if err == nil {
		err = e.toF16Scaled(half[2], vh, nkv, e.scalar(f16Zero), 0, e.scalar(f16AlphaV))
	}
	if err != nil {
		return err
	}
	const queryTile = 64 // FA_Q
	return e.fn.flash.Launch(cuda.Dim3{X: S * c.Heads, Y: (T + queryTile - 1) / queryTile, Z: 1}, cuda.Dim3{X: 128, Y: 1, Z: 1}, 0, e.stream,
		half[0], half[1], half[2], e.scalar(f16AlphaQK), e.scalar(f16AlphaV), float32(1/math.Sqrt(float64(c.HeadDim))),
		int32(T), int32(c.Heads), int32(c.KVHeads), int32(window), qh)
}

// queryBand is how many query positions share one pass of attention's products. Queries [j·B,
// (j+1)·B) of a sequence attend to keys [0, (j+1)·B) only, so bands of B skip the products, and
// the score traffic, above the diagonal's band: with 8 bands, 56% of a whole T×T's.
func (e *GPU) queryBand(T int) int {
	if e.band > 0 {
		return min(e.band, T)
	}
	return min(T, max(128, (T+7)/8))
}

// attentionProducts runs, for each band of queries and each query head of a key/value group,
// one GEMM batched over b = s·KVHeads + kv: queries qh[b] [group·T, D] (head-major within the
// group), keys or values kv[b] [T, D], scores [group·T, T] (row stride T). The scores of band j
// are queries × keys [0, L) with L = (j+1)·B; with outputs, o = P·V over those L keys goes into
// qh.
func (e *GPU) attentionProducts(scores, qh, kv cuda.DevicePtr, S, T, band int, outputs bool) error {
	c := e.cfg
	D, group := c.HeadDim, c.Heads/c.KVHeads
	batch, qRows := S*c.KVHeads, group*T
	scale := float32(1 / math.Sqrt(float64(D)))
	for j0 := 0; j0 < T; j0 += band {
		n, L := min(band, T-j0), min(T, j0+band)
		for head := range group {
			row := head*T + j0 // the band's first query row within its group
			p, o := scores.Add(4*row*T), qh.Add(4*row*D)
			var err error
			if outputs {
				err = e.blas.SgemmStridedBatched(cuda.NoTrans, cuda.NoTrans, D, n, L, 1, kv, D, T*D, p, T, qRows*T,
					0, o, D, qRows*D, batch)
			} else {
				err = e.blas.SgemmStridedBatched(cuda.Trans, cuda.NoTrans, L, n, D, scale, kv, D, T*D, o, D, qRows*D,
					0, p, T, qRows*T, batch)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// mlp is Block.MLP: down(silu(gate(h))·up(h)), or the mixture of experts.
func (e *GPU) mlp(out, h cuda.DevicePtr, g *gpuBlock, rows int, hook GPUHook) error {
	if g.b.MoE != nil {
		return e.moe(out, h, g, rows, hook)
	}
	c := e.cfg
	if err := callGPUHook(hook, GroupGateUp, h, rows, c.Hidden); err != nil {
		return err
	}
	gate, err := e.floats("gate", rows*c.Intermediate)
	if err != nil {
		return err
	}
	up, err := e.floats("up", rows*c.Intermediate)
	if err != nil {
		return err
	}
	if err := e.gateUp(gate, up, h, g.gate, g.up, rows); err != nil {
		return err
	}
	if err := e.elementwise(e.fn.siluMul, rows*c.Intermediate, gate, up, int64(rows*c.Intermediate)); err != nil {
		return err
	}
	if err := callGPUHook(hook, GroupDown, gate, rows, c.Intermediate); err != nil {
		return err
	}
	return e.linear(out, gate, g.down, rows)
}

// gateUp computes gate(h) and up(h), h [rows, gate.in] converted once for both (readSame).
func (e *GPU) gateUp(gateOut, upOut, h cuda.DevicePtr, gate, up *gpuLinear, rows int) error {
	return e.readSame(h, rows*gate.in, func() error {
		if err := e.linear(gateOut, h, gate, rows); err != nil {
			return err
		}
		return e.linear(upOut, h, up, rows)
	})
}

func callGPUHook(hook GPUHook, g Group, x cuda.DevicePtr, rows, cols int) error {
	if hook == nil {
		return nil
	}
	return hook(g, x, rows, cols)
}

// Embed puts the embeddings of seqs, all of one length, on the GPU.
func (e *GPU) Embed(m *Model, seqs [][]int) (*DeviceBatch, error) {
	if len(seqs) == 0 || len(seqs[0]) == 0 {
		return nil, errors.New("model: GPU forward of no tokens")
	}
	if err := e.accepts(m); err != nil {
		return nil, err
	}
	S, T, hid := len(seqs), len(seqs[0]), e.cfg.Hidden
	ids := make([]int32, 0, S*T)
	for s, seq := range seqs {
		if len(seq) != T {
			return nil, fmt.Errorf("model: GPU forward: sequence %d has %d tokens, sequence 0 has %d (all must be equally long)", s, len(seq), T)
		}
		for t, id := range seq {
			if id < 0 || id >= m.Config.Vocab {
				return nil, fmt.Errorf("model: token id %d at position %d of sequence %d is outside the vocabulary [0, %d)", id, t, s, m.Config.Vocab)
			}
			ids = append(ids, int32(id))
		}
	}
	endTable := timeline.Begin(e.dev.Info().Ordinal, "embedding table up")
	table, err := e.weights(m, m.Embed)
	endTable()
	if err != nil {
		return nil, err
	}
	defer timeline.Begin(e.dev.Info().Ordinal, "token ids up, hidden states")()
	dIDs, err := e.buffer("ids", 4*S*T)
	if err != nil {
		return nil, err
	}
	if err := e.upload(dIDs, cuda.Bytes(ids)); err != nil {
		return nil, err
	}
	x := &DeviceBatch{S: S, T: T, e: e}
	if x.X, err = e.dev.Alloc(4 * S * T * hid); err != nil {
		return nil, fmt.Errorf("model: hidden states of %d×%d tokens on the GPU: %w", S, T, err)
	}
	threads := min(hid, 1024)
	if err := e.fn.embed.Launch(cuda.Dim3{X: S * T, Y: 1, Z: 1}, cuda.Dim3{X: threads, Y: 1, Z: 1}, 0, e.stream,
		table, dIDs, x.X, int32(S*T), int32(hid)); err != nil {
		x.Free()
		return nil, err
	}
	return x, nil
}

// weights returns a device copy of one of the model's whole-model tensors (the embedding
// table, the final norm, lm_head), uploaded on first use; tied embeddings share one copy.
func (e *GPU) weights(m *Model, data []float32) (cuda.DevicePtr, error) {
	key := fmt.Sprintf("model %p tensor %p", m, &data[0])
	if b, ok := e.scratch[key]; ok {
		return b.ptr, nil
	}
	p, err := e.buffer(key, 4*len(data))
	if err != nil {
		return 0, err
	}
	if err := e.stager.CopyToDevice(p, cuda.Bytes(data), e.stream); err != nil {
		return 0, err
	}
	return p, nil
}

// Run runs every decoder block of m over x, uploading one block's weights at a time (and reading
// the next block from disk meanwhile). Blocks not resident in m before are released after use.
func (e *GPU) Run(m *Model, x *DeviceBatch) error {
	resident := m.residentBlocks()
	for i := range m.Config.Layers {
		b, err := m.Block(i)
		if err != nil {
			return err
		}
		m.Prefetch(i + 1)
		g, err := e.uploadBlock(b)
		if err != nil {
			return err
		}
		err = e.forwardBlock(g, x, nil)
		if ferr := e.freeBlock(g); err == nil {
			err = ferr
		}
		if err != nil {
			return fmt.Errorf("model: block %d on the GPU: %w", i, err)
		}
		if !resident[i] {
			m.ReleaseBlock(i)
		}
	}
	return nil
}
