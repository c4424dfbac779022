package model

import (
	"fmt"
	"math"

	"github.com/qpack-dev/qpack/cuda"
)

// moe is MoE.forward on rows tokens at h, step for step: the router's logits (and the shared
// expert's gate) come to the host, which routes them as the CPU does (route, expertPlan); the
// tokens of every expert are gathered into one expert-sorted buffer (the embed kernel is a row
// gather), each expert's gate, up and down run as GEMMs on its slice, and each token's output
// is the weighted sum of its slots' rows of Z, gathered into token order and summed by one
// batched GEMM ([1, slots]·[slots, Hidden] per token).
func (e *GPU) moe(out, h cuda.DevicePtr, g *gpuBlock, rows int, hook GPUHook) error {
	m, H := g.b.MoE, e.cfg.Hidden
	I := m.Experts[0].Gate.Out
	if err := callGPUHook(hook, GroupGateUp, h, rows, H); err != nil {
		return err
	}
	p, err := e.routeOnHost(h, g, rows)
	if err != nil {
		return err
	}
	n := len(p.token)
	ids, err := uploadNamed(e, "moe.token", p.token)
	if err != nil {
		return err
	}
	x, err := e.floats("moe.x", n*H)
	if err != nil {
		return err
	}
	if err := e.gatherRows(x, h, ids, n, H); err != nil {
		return err
	}
	gate, err := e.floats("moe.gate", n*I)
	if err != nil {
		return err
	}
	up, err := e.floats("moe.up", n*I)
	if err != nil {
		return err
	}
	obs, err := e.observedRows(m, p, hook)
	if err != nil {
		return err
	}
	// As MoE.forward: every input observed before any product of its stage.
	for i := range m.Experts {
		a, b := p.start[i], p.start[i+1]
		if hook == nil {
			break
		}
		in, err := obs.rows("gate_up", x.Add(4*a*H), a, b, H)
		if err != nil {
			return err
		}
		if err := hook(ExpertGateUp(i), in, b-a, H); err != nil {
			return err
		}
	}
	for i, ex := range m.Experts {
		a, b := p.start[i], p.start[i+1]
		if a == b {
			continue
		}
		if err := e.gateUp(gate.Add(4*a*I), up.Add(4*a*I), x.Add(4*a*H), g.lin[ex.Gate], g.lin[ex.Up], b-a); err != nil {
			return err
		}
	}
	if err := e.elementwise(e.fn.siluMul, n*I, gate, up, int64(n*I)); err != nil {
		return err
	}
	for i := range m.Experts {
		a, b := p.start[i], p.start[i+1]
		if hook == nil {
			break
		}
		act, err := obs.rows("down", gate.Add(4*a*I), a, b, I)
		if err != nil {
			return err
		}
		if err := e.observeDown(hook, g, i, act, b-a, h, rows); err != nil {
			return err
		}
	}
	z, err := e.floats("moe.z", (n+rows)*H)
	if err != nil {
		return err
	}
	for i, ex := range m.Experts {
		a, b := p.start[i], p.start[i+1]
		if a == b {
			continue
		}
		if err := e.linear(z.Add(4*a*H), gate.Add(4*a*I), g.lin[ex.Down], b-a); err != nil {
			return err
		}
	}
	if m.Shared != nil {
		if err := e.sharedExpert(z.Add(4*n*H), h, g, rows, hook); err != nil {
			return err
		}
	}
	return e.combineExperts(out, z, p, rows)
}

// observeDown hands the hook expert i's down input: act, its routed rows' silu(gate)·up, or
// with AllTokens that of every token of h [rows, Hidden].
func (e *GPU) observeDown(hook GPUHook, g *gpuBlock, i int, act cuda.DevicePtr, n int, h cuda.DevicePtr, rows int) error {
	m := g.b.MoE
	x := m.Experts[i]
	if !m.observe.allTokens(i) {
		return hook(ExpertDown(i), act, n, x.Down.In)
	}
	act, err := e.expertActivation(x, g, h, rows, "moe.all")
	if err != nil {
		return err
	}
	return hook(ExpertDown(i), act, rows, x.Down.In)
}

// expertActivation computes silu(gate(h))·up(h) of expert x for h [rows, Hidden] into the
// work buffers name.gate (returned) and name.up.
func (e *GPU) expertActivation(x *Expert, g *gpuBlock, h cuda.DevicePtr, rows int, name string) (cuda.DevicePtr, error) {
	I := x.Gate.Out
	gate, err := e.floats(name+".gate", rows*I)
	if err != nil {
		return 0, err
	}
	up, err := e.floats(name+".up", rows*I)
	if err != nil {
		return 0, err
	}
	if err := e.gateUp(gate, up, h, g.lin[x.Gate], g.lin[x.Up], rows); err != nil {
		return 0, err
	}
	return gate, e.elementwise(e.fn.siluMul, rows*I, gate, up, int64(rows*I))
}

// observedExperts makes the rows an expert's groups observe: the routed rows themselves, or
// under a WeightPower p copies with row i multiplied by its routing weight^(p/2) (a batched
// [cols, 1]·[1, 1] product per row), in one buffer per stage reused expert after expert (the
// hook's work is queued on the stream before the next expert's copy).
type observedExperts struct {
	e     *GPU
	scale cuda.DevicePtr // per row of the plan, 0 when unweighted
}

func (e *GPU) observedRows(m *MoE, p expertPlan, hook GPUHook) (observedExperts, error) {
	o := observedExperts{e: e}
	if hook == nil || m.observe.power == 0 {
		return o, nil
	}
	f := make([]float32, len(p.rowWeight))
	for i, w := range p.rowWeight {
		f[i] = float32(math.Pow(float64(w), m.observe.power/2))
	}
	var err error
	o.scale, err = uploadNamed(e, "moe.rowscale", f)
	return o, err
}

// rows returns the observed copy of rows [a, b) at x (cols wide).
func (o observedExperts) rows(stage string, x cuda.DevicePtr, a, b, cols int) (cuda.DevicePtr, error) {
	if o.scale == 0 || a == b {
		return x, nil
	}
	dst, err := o.e.floats("moe.observed."+stage, (b-a)*cols)
	if err != nil {
		return 0, err
	}
	return dst, o.e.blas.SgemmStridedBatched(cuda.NoTrans, cuda.NoTrans, cols, 1, 1, 1, x, cols, cols,
		o.scale.Add(4*a), 1, 1, 0, dst, cols, cols, b-a)
}

// routeOnHost brings the router's logits of rows tokens (and the shared expert's gate) to the
// host and lays out the routing.
func (e *GPU) routeOnHost(h cuda.DevicePtr, g *gpuBlock, rows int) (expertPlan, error) {
	m := g.b.MoE
	E := len(m.Experts)
	cols := E
	if m.Shared != nil {
		cols++ // the shared expert's gate logit after the router's
	}
	logits, err := e.floats("moe.logits", rows*cols)
	if err != nil {
		return expertPlan{}, err
	}
	if err := e.linear(logits, h, g.lin[m.Router], rows); err != nil {
		return expertPlan{}, err
	}
	if m.Shared != nil {
		if err := e.linear(logits.Add(4*rows*E), h, g.lin[m.SharedGate], rows); err != nil {
			return expertPlan{}, err
		}
	}
	host := make([]float32, rows*cols)
	// (on the engine's stream: a synchronous copy would wait for the GPU's other streams too,
	// the uploads ahead and the solvers')
	if err := e.stager.CopyFromDevice(cuda.Bytes(host), logits, e.stream); err != nil {
		return expertPlan{}, err
	}
	p := route(host[:rows*E], rows, E, m.TopK, m.NormTopK).plan(E, m.Shared != nil)
	if m.Shared != nil {
		for t, v := range host[rows*E:] {
			p.weight[t*p.slots+p.slots-1] = sigmoid(v)
		}
	}
	return p, nil
}

// sharedExpert writes the shared expert's outputs for h [rows, Hidden] into y.
func (e *GPU) sharedExpert(y, h cuda.DevicePtr, g *gpuBlock, rows int, hook GPUHook) error {
	x := g.b.MoE.Shared
	gate, err := e.expertActivation(x, g, h, rows, "moe.shared")
	if err != nil {
		return err
	}
	if err := callGPUHook(hook, GroupDown, gate, rows, x.Down.In); err != nil {
		return err
	}
	return e.linear(y, gate, g.lin[x.Down], rows)
}

// combineExperts sets out[t] = Σ_j weight[t, j]·Z[pos[t, j]] for rows tokens: the rows of Z
// gathered in token order, then one [Hidden, slots]·[slots, 1] product per token.
func (e *GPU) combineExperts(out, z cuda.DevicePtr, p expertPlan, rows int) error {
	H := e.cfg.Hidden
	pos, err := uploadNamed(e, "moe.pos", p.pos)
	if err != nil {
		return err
	}
	w, err := uploadNamed(e, "moe.weight", p.weight)
	if err != nil {
		return err
	}
	y, err := e.floats("moe.y", rows*p.slots*H)
	if err != nil {
		return err
	}
	if err := e.gatherRows(y, z, pos, rows*p.slots, H); err != nil {
		return err
	}
	// Column-major: token t's Y is H×slots (ld H), its weights slots×1, its output H×1.
	return e.blas.SgemmStridedBatched(cuda.NoTrans, cuda.NoTrans, H, 1, p.slots, 1, y, H, p.slots*H,
		w, p.slots, p.slots, 0, out, H, H, rows)
}

// gatherRows sets dst[i] = src[ids[i]] for n rows of cols floats (the embed kernel).
func (e *GPU) gatherRows(dst, src, ids cuda.DevicePtr, n, cols int) error {
	if n == 0 {
		return nil
	}
	return e.fn.embed.Launch(cuda.Dim3{X: n, Y: 1, Z: 1}, cuda.Dim3{X: min(cols, 1024), Y: 1, Z: 1}, 0, e.stream,
		src, ids, dst, int32(n), int32(cols))
}

// uploadNamed queues the copy of v into the named buffer on the engine's stream.
func uploadNamed[T int32 | float32](e *GPU, name string, v []T) (cuda.DevicePtr, error) {
	p, err := e.buffer(name, 4*len(v))
	if err != nil {
		return 0, err
	}
	if len(v) == 0 {
		return p, nil
	}
	if err := e.upload(p, cuda.Bytes(v)); err != nil {
		return 0, fmt.Errorf("model: %s to the GPU: %w", name, err)
	}
	return p, nil
}
