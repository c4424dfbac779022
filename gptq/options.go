package gptq

import "time"

// Defaults of the reference implementation (IST-DASLab/gptq, AutoGPTQ).
const (
	DefaultDamp      = 0.01 // relative damping, percdamp
	DefaultMaxDamp   = 1.0  // the retries stop after this relative damping
	DefaultBlockSize = 128  // columns per lazy batch
)

// Options choose the GPTQ variant. The zero value is the reference's default: damping 0.01,
// blocks of 128, groups fitted on the fly in column order, min-max group parameters.
type Options struct {
	// Damp is λ/mean(diag H): the damping added to the Hessian's diagonal (default 0.01). When
	// the Cholesky factorisation fails it is multiplied by 10 and tried again, up to MaxDamp
	// (default 1).
	Damp, MaxDamp float64
	// BlockSize is the number of columns per lazy batch (default 128).
	BlockSize int
	// ActOrder (desc_act) quantizes the columns in order of decreasing diag H. With groups
	// fitted on the fly the groups follow that order and the tensor gets a GIdx.
	ActOrder bool
	// StaticGroups fits every group's parameters on the original weights before any update,
	// in the original column order, so GIdx stays trivial even with ActOrder.
	StaticGroups bool
	// Clip fits group parameters with the reference quantizer's clipping search (mse=True; the
	// same search as blockwise's Options.Clip) instead of plain min-max.
	Clip bool
	// Imatrix fits group parameters with blockwise's importance-weighted scale search
	// (Options.Imatrix): the scale and zero minimising Σ_k H_kk·(w_k − ŵ_k)² over the group's
	// weights as they stand when the group is fitted, H_kk being the Hessian's diagonal
	// (2·E[x_k²], the imatrix). It takes precedence over MSE. GPUSolver runs both searches too,
	// with the same results.
	Imatrix bool
	// GlobalScale is the global scale of an NVFP4 tensor (blockwise.Options.GlobalScale),
	// e.g. one shared by q, k and v; 0 computes it from W's largest |w| before any update.
	GlobalScale float32
	// BaselineLoss also computes tr(W H Wᵀ) for Stats.RelativeLoss. It costs as much as
	// the quantization's own updates (N·K² multiply-adds), so it is off by default. The CPU
	// forms it in float32 products (within about 1e-6), the GPU in float64.
	BaselineLoss bool
	// Work, when set, holds buffers reused across calls (one Quantize at a time).
	Work *Workspace
}

func (o Options) withDefaults() Options {
	if o.Damp == 0 {
		o.Damp = DefaultDamp
	}
	if o.MaxDamp == 0 {
		o.MaxDamp = max(DefaultMaxDamp, o.Damp)
	}
	if o.BlockSize == 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.Work == nil {
		o.Work = new(Workspace)
	}
	return o
}

// Stats describe one quantization.
type Stats struct {
	// Loss is the proxy loss tr(ΔW H ΔWᵀ) with ΔW = W − Q and the undamped H as given
	// (the weights of dead columns count as zero): ‖ΔW X‖² scaled like H.
	Loss float64
	// Baseline is tr(W H Wᵀ) and RelativeLoss = Loss/Baseline; both 0 unless
	// Options.BaselineLoss is set.
	Baseline, RelativeLoss float64
	// Damp is the relative damping that succeeded and Lambda the value added to diag H.
	Damp, Lambda float64
	// Retries counts the failed factorisations; each one's damping is in FailedDamps.
	Retries     int
	FailedDamps []float64
	// DeadColumns counts input channels with H_ii = 0.
	DeadColumns int
	// Factor is the time spent on damping and the Cholesky factor, Total the whole call.
	Factor, Total time.Duration
	// GPU only: Setup is the time spent checking the weights and putting W and H on the
	// device, Baseline computing the baseline loss.
	Setup, BaselineTime time.Duration
}

// Workspace holds Quantize's large buffers: the K×K float64 factorisation (8·K² bytes), the
// float32 column factor T′ (4·K²) and the N×K working weights (4·N·K).
type Workspace struct {
	factor []float64
	t      []float32
	w      []float32
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
