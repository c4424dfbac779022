package packing

import (
	"fmt"

	"github.com/qpack-dev/qpack/quant"
)

// CompressedTensors is compressed-tensors' "pack-quantized" layout (docs/reference/formats.md §3.1) for
// integer 2/4/8-bit schemes. For W[N, K] with ng groups:
//
//	P.weight_packed     I32 [N, ⌈K·b/32⌉]  each row's codes packed along K (PackStream)
//	P.weight_scale      F16 [N, ng]
//	P.weight_zero_point I32 [⌈N·b/32⌉, ng] asymmetric only: zero points packed along N
//	P.weight_shape      I64 [2] = [N, K]
//	P.weight_g_idx      I32 [K]            act-order only
//
// compressed-tensors' codes are signed, q_ct ∈ [−2^(b−1), 2^(b−1)), and stored plus 2^(b−1);
// its zero points likewise. With q = q_ct + 2^(b−1) and z = zp + 2^(b−1) the stored values are
// exactly quant.Tensor's unsigned codes and zero points, and a symmetric scheme (zp = 0) is
// z = 2^(b−1).
//
// The FP4 schemes are its nvfp4-pack-quantized and mxfp4-pack-quantized layouts (microscaled.go):
//
//	P.weight_packed       U8      [N, K/2]   two E2M1 codes a byte, even column in the low nibble
//	P.weight_scale        F8_E4M3 [N, K/16]  nvfp4: E4M3 block scales s
//	                      U8      [N, K/32]  mxfp4: E8M0 block scales (2^(e−127))
//	P.weight_global_scale F32     [1]        nvfp4: G, a divisor: w = e2m1·(s/G)
//
// with no weight_shape, which vLLM's FP4 schemes do not load.
type CompressedTensors struct{}

func (CompressedTensors) MixedSchemes() bool { return false }

func (CompressedTensors) Name() string { return "compressed-tensors" }

func (CompressedTensors) Supports(s quant.Scheme) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := refuseKQuant("compressed-tensors", s); err != nil {
		return err
	}
	if s.IsFP4() {
		return nil // nvfp4-pack-quantized, mxfp4-pack-quantized
	}
	if s.Grid != quant.Integer {
		return fmt.Errorf("format compressed-tensors holds integer (pack-quantized), nvfp4 and mxfp4 schemes, not %s: use format qpack", s)
	}
	if s.Bits > 4 && s.Bits < 8 {
		return fmt.Errorf("format compressed-tensors: loaders take 2-, 3-, 4- and 8-bit codes, not %s: use format qpack", s)
	}
	if s.Bits == 3 {
		// docs/reference/formats.md §3.1/§8.2: 3-bit packing changed in 2026 (wasted bits → dense stream).
		return fmt.Errorf("format compressed-tensors packs 3-bit codes differently across versions, so %s would not load everywhere: use format gptq or qpack", s)
	}
	return nil
}

func (f CompressedTensors) Pack(prefix string, t *quant.Tensor) ([]Raw, error) {
	if err := checkTensor(prefix, t); err != nil {
		return nil, err
	}
	s, n, k := t.Scheme, t.N, t.K
	if err := f.Supports(s); err != nil {
		return nil, fmt.Errorf("tensor %s: %w", prefix, err)
	}
	if s.IsFP4() {
		return packMicroscaled(t, ctMicroNames(prefix))
	}
	ng := s.Groups(k)
	kw := PackedLen[uint32](k, s.Bits)
	packed := make([]uint32, n*kw)
	err := eachRows(n, k, func(r0, r1 int) error {
		for r := r0; r < r1; r++ {
			if err := PackStream(packed[r*kw:(r+1)*kw], 1, t.Codes[r*k:(r+1)*k], 1, k, s.Bits); err != nil {
				return fmt.Errorf("tensor %s, output row %d: %w", prefix, r, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	scales, err := f16Raw(prefix+".weight_scale", t.Scales, identity, n, ng)
	if err != nil {
		return nil, err
	}
	out := []Raw{wordsRaw(prefix+".weight_packed", packed, n, kw), scales}
	if !s.Sym {
		nw := PackedLen[uint32](n, s.Bits)
		zp := make([]uint32, nw*ng)
		for g := range ng {
			if err := PackStream(zp[g:], ng, t.Zeros[g:], ng, n, s.Bits); err != nil {
				return nil, fmt.Errorf("tensor %s zeros: %w", prefix, err)
			}
		}
		out = append(out, wordsRaw(prefix+".weight_zero_point", zp, nw, ng))
	}
	out = append(out, shapeRaw(prefix+".weight_shape", n, k))
	if t.GIdx != nil {
		out = append(out, int32sRaw(prefix+".weight_g_idx", t.GIdx))
	}
	return out, nil
}

func (CompressedTensors) Metadata(string, *quant.Tensor) map[string]string { return nil }

func (f CompressedTensors) Unpack(prefix string, get func(string) (Raw, bool), meta map[string]string) (*quant.Tensor, error) {
	s, err := supportedScheme(f, prefix, meta)
	if err != nil {
		return nil, err
	}
	g := getter(get)
	n, k, err := f.Dims(prefix, get)
	if err != nil {
		return nil, err
	}
	if s.IsFP4() {
		t, err := unpackMicroscaled(g, ctMicroNames(prefix), s, n, k)
		if err != nil {
			return nil, err
		}
		return checkUnpacked(prefix, t)
	}
	ng := s.Groups(k)
	kw := PackedLen[uint32](k, s.Bits)
	wp, err := g.need(prefix + ".weight_packed")
	if err != nil {
		return nil, err
	}
	if err := wp.expect("I32", n, kw); err != nil {
		return nil, err
	}
	sc, err := g.need(prefix + ".weight_scale")
	if err != nil {
		return nil, err
	}
	if err := sc.expect("F16", n, ng); err != nil {
		return nil, err
	}
	t := &quant.Tensor{Scheme: s, N: n, K: k, Codes: make([]uint8, n*k),
		Scales: make([]float32, n*ng), Zeros: make([]uint8, n*ng)}
	words := rawWords(wp)
	err = eachRows(n, k, func(r0, r1 int) error {
		for r := r0; r < r1; r++ {
			if err := UnpackStream(t.Codes[r*k:(r+1)*k], 1, words[r*kw:(r+1)*kw], 1, k, s.Bits); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	rawF16(sc, t.Scales, identity)
	if s.Sym {
		for i := range t.Zeros {
			t.Zeros[i] = uint8(symZero(s))
		}
	} else {
		zr, err := g.need(prefix + ".weight_zero_point")
		if err != nil {
			return nil, err
		}
		nw := PackedLen[uint32](n, s.Bits)
		if err := zr.expect("I32", nw, ng); err != nil {
			return nil, err
		}
		zwords := rawWords(zr)
		for gi := range ng {
			if err := UnpackStream(t.Zeros[gi:], ng, zwords[gi:], ng, n, s.Bits); err != nil {
				return nil, err
			}
		}
	}
	if gr, ok := get(prefix + ".weight_g_idx"); ok {
		gr.Name = prefix + ".weight_g_idx"
		if err := gr.expect("I32", k); err != nil {
			return nil, err
		}
		gidx := rawInt32s(gr)
		if err := checkGIdx(gr.Name, gidx, k, ng); err != nil {
			return nil, err
		}
		if !trivialGIdx(s, gidx) {
			t.GIdx = gidx
		}
	}
	return checkUnpacked(prefix, t)
}

func (CompressedTensors) Bytes(s quant.Scheme, n, k int) int64 {
	if s.IsFP4() {
		return microscaledBytes(s, n, k)
	}
	ng := int64(s.Groups(k))
	b := int64(n)*int64(PackedLen[uint32](k, s.Bits))*4 + int64(n)*ng*2 + 16
	if !s.Sym {
		b += int64(PackedLen[uint32](n, s.Bits)) * ng * 4
	}
	return b
}

func (CompressedTensors) TensorNames(prefix string) []string {
	return []string{prefix + ".weight_packed", prefix + ".weight_scale", prefix + ".weight_zero_point",
		prefix + ".weight_shape", prefix + ".weight_g_idx", prefix + ".weight_global_scale"}
}

// ctMicroNames are compressed-tensors' names for the FP4 tensors (microscaled.go).
func ctMicroNames(prefix string) microNames {
	return microNames{codes: prefix + ".weight_packed", scales: prefix + ".weight_scale", global: prefix + ".weight_global_scale"}
}
